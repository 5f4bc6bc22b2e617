"""submit()/submit_all() with a fake producer and fake end-offset probes: no broker needed."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from writ_client import CanonicalJsonError, EntityRef, IntentInput, KeyedTool, WritClient, intent_key
from writ_client.client import _Ends

TOOL = KeyedTool(name="t", key_scope="run", intent_fields=("a",))


class FakeProducer:
    """Records what was produced; delivers at once unless told to fail."""

    def __init__(self) -> None:
        self.produced: list[tuple[bytes, bytes]] = []

    def produce(self, topic: str, *, value: bytes, key: bytes, headers: Any, on_delivery: Any) -> None:
        self.produced.append((key, value))
        on_delivery(None, None)

    def poll(self, timeout: float) -> int:
        return 0


def started_client(producer: Any = None, **kwargs: Any) -> WritClient:
    client = WritClient(brokers="127.0.0.1:1", agent_id="a", reply_topic="writ.replies.a", **kwargs)
    client._producer = producer or FakeProducer()
    client._started = True
    client._reply_partitions = 1
    client._end_offsets = lambda: None  # type: ignore[method-assign]
    return client


def intent_input(entity_id: str = "x", *, tool: KeyedTool = TOOL, params: dict[str, Any] | None = None, value: Any = 1) -> IntentInput:
    return IntentInput(
        tool=tool, entity=EntityRef(type="t", id=entity_id), run_id="r", step_id="s", base_version='"v"',
        delta=[{"op": "add", "path": "/a", "value": value}], params={"a": 1} if params is None else params,
    )


def test_a_lone_surrogate_in_a_params_key_is_refused_before_sending() -> None:
    producer = FakeProducer()
    client = started_client(producer)
    with pytest.raises(CanonicalJsonError) as err:
        client.submit_all([intent_input("ok"), intent_input("bad", params={"a": 1, "\ud800": 2})], timeout=5)
    assert err.value.code == "not_canonical"
    assert "/params/" in str(err.value)
    assert producer.produced == [] and client._waiting == {}


def test_a_surrogate_pair_written_as_two_code_points_in_a_params_key_is_sent_as_the_emoji() -> None:
    tool = KeyedTool(name="t", key_scope="run", intent_fields=("\ud83d\ude00",))
    owners_tool = KeyedTool(name="t", key_scope="run", intent_fields=("\U0001f600",))  # the field as JavaScript holds it
    client = started_client()
    intent = client.build_intent(intent_input(tool=tool, params={"\ud83d\ude00": 5}))
    wire, _ = client._prepare(intent)
    assert wire["params"] == {"\U0001f600": 5}
    # The owner recomputes the key from what it parses: the key the client sent.
    parsed = json.loads(client.codec.encode("writ.intents", "WriteIntent", wire))
    assert intent_key(tool=owners_tool, agent_id="a", run_id="r", step_id="s", entity=parsed["entity"], params=parsed["params"]) == intent.intent_key


def test_a_batch_past_its_deadline_probes_the_reply_partitions_once_for_all() -> None:
    client = started_client()
    probes: list[float] = []

    def slow_blocked_ends() -> dict[int, _Ends]:
        probes.append(time.monotonic())
        time.sleep(0.3)  # a broker slow to answer list_offsets, not a synchronisation
        return {0: _Ends(5, 7)}  # the read_committed end stays behind the high watermark: an open transaction

    client._end_offsets = slow_blocked_ends  # type: ignore[method-assign]
    started = time.monotonic()
    results = client.submit_all([intent_input(f"x{i}") for i in range(8)], timeout=0.1)
    elapsed = time.monotonic() - started
    assert [r.status for r in results] == ["blocked"] * 8
    # One probe as the wait begins, one fresh one at the deadline for the whole batch (not one per intent).
    assert len(probes) == 2
    assert elapsed < 0.1 + 10.0  # the deadline plus the one bounded probe step
