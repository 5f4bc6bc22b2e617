"""The models' length bounds count UTF-16 code units, as owners (zod) do: no broker needed."""

from __future__ import annotations

import re
from typing import get_args

import pytest
from pydantic import ValidationError

from writ_client import EntityRef, IntentInput, KeyedTool, NoReplyReason, UnknownOutcome, WritClient
from writ_client.models import AgentRef, Versioned

from .conftest import REPO

EMOJI = "\U0001f600"  # two UTF-16 code units


def test_an_entity_id_is_at_most_256_utf16_code_units() -> None:
    assert EntityRef(type="t", id=EMOJI * 128).id == EMOJI * 128
    assert EntityRef(type="t", id="x" * 256).id == "x" * 256
    with pytest.raises(ValidationError, match="UTF-16"):
        EntityRef(type="t", id=EMOJI * 129)  # 129 code points, 258 code units: owners refuse it (schema_invalid)
    with pytest.raises(ValidationError):
        EntityRef(type="t", id="")


def test_agent_fields_and_versions_count_utf16_code_units() -> None:
    with pytest.raises(ValidationError, match="UTF-16"):
        AgentRef(id=EMOJI * 65, run_id="r", step_id="s")
    with pytest.raises(ValidationError, match="UTF-16"):
        AgentRef(id="a", run_id=EMOJI * 129, step_id="s")
    with pytest.raises(ValidationError, match="UTF-16"):
        AgentRef(id="a", run_id="r", step_id="s", tool_call_id=EMOJI * 129)
    assert AgentRef(id=EMOJI * 64, run_id=EMOJI * 128, step_id="s").id == EMOJI * 64
    with pytest.raises(ValidationError, match="UTF-16"):
        Versioned(state=None, version=EMOJI * 129)


def test_an_intent_with_a_run_id_owners_would_refuse_is_not_built() -> None:
    client = WritClient(brokers="127.0.0.1:1", agent_id="a", reply_topic="writ.replies.a")
    tool = KeyedTool(name="t", key_scope="run", intent_fields=())
    with pytest.raises(ValidationError, match="UTF-16"):
        client.build_intent(
            IntentInput(tool=tool, entity=EntityRef(type="t", id="x"), run_id=EMOJI * 200, step_id="s", base_version='"v"',
                        delta=[{"op": "add", "path": "/a", "value": 1}], params={})
        )


def test_an_undo_goes_on_the_wire_as_owners_take_it_and_other_intents_carry_no_undo() -> None:
    """An undo: the undone key under ``undo``, no delta, base version ``ledger``; the schema of the wire contract."""
    import json

    from writ_client import AppliedReply, undo_intent_key

    client = WritClient(brokers="127.0.0.1:1", agent_id="a", reply_topic="writ.replies.a")
    done = "ab" * 32
    reply = AppliedReply.model_validate(
        {"status": "applied", "intentId": "i", "intentKey": done, "duplicate": False, "at": "2026-01-01T00:00:00.000Z",
         "entity": {"type": "payment", "id": "pay_1"}, "version": '"v2"', "via": "patch", "tool": "refund_payment"}
    )
    undo = client.build_undo(reply).to_wire()
    assert (undo["intentKey"], undo["undo"], undo["delta"], undo["params"], undo["baseVersion"], undo["tool"]) == (
        undo_intent_key(done), {"intentKey": done}, [], {}, "ledger", "refund_payment"
    )
    assert undo["entity"] == {"type": "payment", "id": "pay_1"} and undo["agent"]["stepId"] == f"undo-{done[:16]}"
    tool = KeyedTool(name="t", key_scope="run", intent_fields=())
    plain = client.build_intent(IntentInput(tool=tool, entity=EntityRef(type="t", id="x"), run_id="r", step_id="s", base_version='"v"',
                                            delta=[{"op": "add", "path": "/a", "value": 1}], params={})).to_wire()
    assert "undo" not in plain and "undo" not in json.loads(json.dumps(plain))
    # Only an undo has no delta; a reply that names no tool cannot be undone without one.
    with pytest.raises(ValidationError, match="only an undo, a lease acquire or a lease release has none"):
        client.build_intent(IntentInput(tool=tool, entity=EntityRef(type="t", id="x"), run_id="r", step_id="s", base_version='"v"', delta=[], params={}))
    with pytest.raises(ValueError, match="does not name its tool"):
        client.build_undo(reply.model_copy(update={"tool": None}))


def test_an_unknown_outcomes_reason_is_typescripts_no_reply_reason() -> None:
    # An outcome of the TypeScript client (relayed as JSON) parses here: the reasons are the same set.
    source = (REPO / "producers" / "client-api.ts").read_text("utf-8")
    declared = re.search(r"export type NoReplyReason = ([^;]+);", source)
    assert declared is not None, "producers/client-api.ts no longer declares NoReplyReason"
    assert set(get_args(NoReplyReason)) == set(re.findall(r'"([a-z_]+)"', declared.group(1)))
    for reason in get_args(NoReplyReason):
        assert UnknownOutcome.model_validate({"status": "unknown", "intent_id": "i", "intent_key": "k", "message": "m", "reason": reason}).reason == reason
    with pytest.raises(ValidationError):
        UnknownOutcome.model_validate({"status": "unknown", "intent_id": "i", "intent_key": "k", "message": "m", "reason": "other"})
