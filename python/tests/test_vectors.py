"""The golden vectors of test/fixtures/intent-key-vectors.json, shared with the TypeScript suite."""

from __future__ import annotations

import json
from typing import Any

import pytest

from writ_client import RESOLUTION_FIELDS_BYTES, KeyedTool, canonical_json, entity_key, intent_key, intent_key_material, murmur2, params_fingerprint, partition_for, resolution_bounds, sha256_hex, undo_intent_key
from writ_client.keys import change_id, lease_intent_key
from writ_client.canonical import CanonicalJsonError
from writ_client.keys import KEY_VERSION

from .conftest import REPO

VECTORS = json.loads((REPO / "test" / "fixtures" / "intent-key-vectors.json").read_text("utf-8"))


def tool_of(v: dict[str, Any]) -> KeyedTool:
    t = v["tool"]
    return KeyedTool(name=t["name"], key_scope=t["keyScope"], intent_fields=tuple(t["intentFields"]), free_text_params=tuple(t["freeTextParams"]))


def test_the_file_is_the_key_version_this_client_builds() -> None:
    assert VECTORS["keyVersion"] == KEY_VERSION
    assert len(VECTORS["vectors"]) >= 40
    assert any("error" in v["expected"] for v in VECTORS["vectors"])


@pytest.mark.parametrize("v", VECTORS["vectors"], ids=[v["name"] for v in VECTORS["vectors"]])
def test_vector(v: dict[str, Any]) -> None:
    params = json.loads(v["paramsJson"])
    tool = tool_of(v)
    expected = v["expected"]
    material = intent_key_material(tool=tool, agent_id=v["agentId"], run_id=v["runId"], step_id=v["stepId"], entity=v["entity"], params=params)
    if "error" in expected:
        # Params with no canonical form (RFC 8785): the key and the fingerprint are refused, with the same code as TypeScript's.
        for compute in (
            lambda: canonical_json(material),
            lambda: intent_key(tool=tool, agent_id=v["agentId"], run_id=v["runId"], step_id=v["stepId"], entity=v["entity"], params=params),
            lambda: params_fingerprint(tool.name, v["entity"], params, tool.free_text_params),
        ):
            with pytest.raises(CanonicalJsonError) as err:
                compute()
            assert err.value.code == expected["error"]
        return
    # Byte for byte: the canonical text, then its hash.
    assert canonical_json(material).encode("utf-8") == expected["canonical"].encode("utf-8")
    assert sha256_hex(expected["canonical"]) == expected["intentKey"]
    assert intent_key(tool=tool, agent_id=v["agentId"], run_id=v["runId"], step_id=v["stepId"], entity=v["entity"], params=params) == expected["intentKey"]
    assert params_fingerprint(tool.name, v["entity"], params, tool.free_text_params) == expected["paramsFingerprint"]
    assert entity_key(v["entity"]) == expected["entityKey"]
    assert partition_for(expected["entityKey"], VECTORS["partitioner"]["partitions"]) == expected["partition"]


@pytest.mark.parametrize("u", VECTORS["undo"]["vectors"], ids=[u["undoneKey"][:16] for u in VECTORS["undo"]["vectors"]])
def test_undo_vector(u: dict[str, Any]) -> None:
    """An undo's key, from the undone key only (wire contract §5.7): the canonical text byte for byte, then its hash."""
    assert canonical_json({"v": KEY_VERSION, "undo": u["undoneKey"]}).encode("utf-8") == u["expected"]["canonical"].encode("utf-8")
    assert sha256_hex(u["expected"]["canonical"]) == u["expected"]["intentKey"]
    assert undo_intent_key(u["undoneKey"]) == u["expected"]["intentKey"]


@pytest.mark.parametrize("c", VECTORS["change"]["vectors"], ids=[c["stepId"] for c in VECTORS["change"]["vectors"]])
def test_change_vector(c: dict[str, Any]) -> None:
    """A change's id and its lease intents' keys (wire contract §5.8), byte for byte."""
    assert canonical_json({"v": KEY_VERSION, "change": {"agent": c["agentId"], "run": c["runId"], "step": c["stepId"]}}).encode("utf-8") == c["expected"]["canonical"].encode("utf-8")
    assert change_id(agent_id=c["agentId"], run_id=c["runId"], step_id=c["stepId"]) == c["expected"]["changeId"]
    for lease in c["leases"]:
        assert sha256_hex(lease["expected"]["canonical"]) == lease["expected"]["intentKey"]
        assert lease_intent_key(c["expected"]["changeId"], lease["op"], lease["entity"]) == lease["expected"]["intentKey"]


def test_an_undo_key_needs_an_intent_key() -> None:
    with pytest.raises(ValueError, match="64 lower-case hex"):
        undo_intent_key("A" * 64)


@pytest.mark.parametrize("k", VECTORS["partitioner"]["keys"], ids=[k["key"][:40] for k in VECTORS["partitioner"]["keys"]])
def test_partition_vector(k: dict[str, Any]) -> None:
    assert murmur2(k["key"].encode("utf-8")) == k["murmur2"]
    assert partition_for(k["key"], VECTORS["partitioner"]["partitions"]) == k["partition"]


def test_python_values_that_json_cannot_tell_apart_give_the_same_key() -> None:
    """Values built in Python (not parsed from the vectors' JSON text): 100.0 and 100, -0.0 and 0, a surrogate pair as two code points."""
    by_name = {v["name"]: v for v in VECTORS["vectors"]}
    v = by_name["number: 100"]
    tool = tool_of(v)
    base = dict(tool=tool, agent_id=v["agentId"], run_id=v["runId"], step_id=v["stepId"], entity=v["entity"])
    assert intent_key(**base, params={"v": 100.0}) == v["expected"]["intentKey"]
    assert intent_key(**base, params={"v": 100}) == v["expected"]["intentKey"]
    assert intent_key(**base, params={"v": -0.0}) == by_name["number: 0"]["expected"]["intentKey"]
    assert intent_key(**base, params={"v": 9007199254740993}) == by_name["number: 2^53 + 1 rounds to 2^53"]["expected"]["intentKey"]
    assert by_name["number: an integer beyond the double range is Infinity (refused)"]["expected"] == {"error": "not_canonical"}
    for refused in (10**310, float("inf"), float("-inf"), float("nan"), "x\ud800"):
        with pytest.raises(CanonicalJsonError) as err:
            intent_key(**base, params={"v": refused})
        assert err.value.code == "not_canonical"
    assert intent_key(**base, params={"v": "\ud83d\ude00"}) == by_name["string: a surrogate pair written escaped is the emoji"]["expected"]["intentKey"]
    assert intent_key(**base, params={"v": "\U0001f600"}) == by_name["string: a surrogate pair written escaped is the emoji"]["expected"]["intentKey"]
    assert intent_key(**base, params={"v": ("a",)}) == intent_key(**base, params={"v": ["a"]})


RESOLUTION_BOUNDS = json.loads((REPO / "test" / "fixtures" / "resolution-bounds-vectors.json").read_text("utf-8"))


@pytest.mark.parametrize("v", RESOLUTION_BOUNDS["vectors"], ids=lambda v: f"{v['maxIntentBytes']}-{v['maxJsonDepth']}")
def test_resolution_bounds_vector(v: dict[str, Any]) -> None:
    """What owners admit of a resolution, from their intent bounds (TypeScript's ``resolutionBounds``)."""
    assert RESOLUTION_FIELDS_BYTES == RESOLUTION_BOUNDS["fieldsBytes"]
    b = resolution_bounds(v["maxIntentBytes"], v["maxJsonDepth"])
    e = v["expected"]
    assert (b.max_bytes, b.max_depth, b.delta_max_bytes, b.delta_max_depth) == (e["maxBytes"], e["maxDepth"], e["delta"]["maxBytes"], e["delta"]["maxDepth"])
