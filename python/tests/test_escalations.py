"""Escalations from Python, against the TypeScript owner (demo tools): read from ``writ.human``, resolved by an
operator's client, the effects counted at the records server (its own Idempotency-Key dedupe off)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from writ_client import (
    AppliedReply,
    ConflictReply,
    EscalatedReply,
    Escalation,
    IntentInput,
    IntentRefused,
    RejectedReply,
    WritClient,
    WriteIntent,
    build_resolution,
    is_open,
    resolution_bounds,
)
from writ_client.client import DEFAULT_MAX_INTENT_BYTES, DEFAULT_MAX_JSON_DEPTH
from writ_client.codec import json_depth
from writ_client.devstack import RecordsAdmin, Stack
from writ_client.escalations import latest_ledger_entries

from .conftest import make_client
from .test_client import TAG


@pytest.fixture(scope="module")
def operator(stack: Stack, topics: dict[str, str], owner: Any) -> Iterator[WritClient]:
    c = make_client(stack, topics, "py-ops")
    yield c
    c.close()


def tag_input(tid: str, run: str, base: dict[str, Any]) -> IntentInput:
    return IntentInput(
        tool=TAG,
        entity={"type": "ticket", "id": tid},
        run_id=run,
        step_id="tag-1",
        base_version=base["version"],
        delta=[{"op": "replace", "path": "/tags", "value": [*base["state"]["tags"], "needs-human"]}],
        params={"tag": "needs-human"},
    )


def escalate(
    agent: WritClient, records: RecordsAdmin, tid: str, shape: Callable[[IntentInput], IntentInput | WriteIntent] = lambda i: i
) -> tuple[EscalatedReply, IntentInput]:
    """The agent's tag on ``tid`` conflicts three times (the record touched before each try): escalated. ``shape``:
    what each try submits, from the input it would."""
    records.seed("ticket", tid, {"status": "open", "tags": []})
    base, run = records.read("ticket", tid), f"run-{uuid.uuid4().hex[:8]}"
    last: Any = None
    for i in range(3):
        records.seed("ticket", tid, {"status": f"touched-{i}", "tags": []})
        last = agent.submit(shape(tag_input(tid, run, base)), timeout=30)
        if isinstance(last, ConflictReply):
            base = {"state": last.current.state, "version": last.current.version}
    assert isinstance(last, EscalatedReply) and last.reason == "conflict_cycles_exhausted", last
    return last, tag_input(tid, run, base)


def escalation_of(operator: WritClient, topics: dict[str, str], escalated: EscalatedReply) -> Escalation:
    found = [r for r in operator.read_escalations() if r.escalation.escalation_id == escalated.escalation_id]
    assert len(found) == 1, found
    e = found[0].escalation
    assert e.intent_key == escalated.intent_key and e.reason == "conflict_cycles_exhausted" and e.current is not None
    return e


def replies_to(agent: WritClient, intent_id: str, status: str) -> tuple[list[Any], threading.Thread]:
    """Collects, in a thread, the agent's first reply with ``intent_id`` and ``status`` (registered before anything is sent)."""
    stream = agent.replies(idle_timeout=60)
    seen: list[Any] = []

    def read() -> None:
        with stream:
            for r in stream:
                if r.intent_id == intent_id and r.status == status:
                    seen.append(r)
                    return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return seen, t


def test_apply_writes_the_escalated_intent_once_on_the_version_the_operator_decided_on(
    client: WritClient, operator: WritClient, records: RecordsAdmin, topics: dict[str, str], uid: str
) -> None:
    tid = f"T-e-{uid}"
    escalated, intent = escalate(client, records, tid)
    e = escalation_of(operator, topics, escalated)
    # The record changed after the escalation showed it: an apply on the version it showed is a conflict, nothing written.
    records.seed("ticket", tid, {"status": "touched-after", "tags": []})
    stale = operator.resolve(e, "apply", timeout=30)
    assert isinstance(stale, RejectedReply) and stale.reason == "resolution_conflict", stale
    assert records.patch_requests(e.intent_key) == 0
    # On the version the operator has now looked at: applied once, and the agent hears it under its intent's id.
    seen, reader = replies_to(client, escalated.intent_id, "applied")
    now = records.read("ticket", tid)
    done = operator.resolve(e, "apply", base_version=now["version"], timeout=30)
    assert isinstance(done, AppliedReply) and done.resolved_by == "py-ops", done
    assert records.read("ticket", tid)["state"]["tags"] == ["needs-human"]
    assert records.patch_requests(e.intent_key) == 1
    reader.join(timeout=60)
    assert seen and seen[0].resolved_by == "py-ops", seen
    # The ledger holds the decision: the agent asking again is answered from it; a second apply is refused.
    again = client.submit(intent, timeout=30)
    assert isinstance(again, AppliedReply) and again.duplicate is True, again
    twice = operator.resolve(e, "apply", base_version=now["version"], timeout=30)
    assert isinstance(twice, RejectedReply) and twice.reason == "resolution_not_applicable", twice
    assert records.patch_requests(e.intent_key) == 1


def test_discard_and_return_write_nothing_and_tell_the_agent(client: WritClient, operator: WritClient, records: RecordsAdmin, topics: dict[str, str], uid: str) -> None:
    for decision, reason in (("discard", "escalation_discarded"), ("return", "returned_by_operator")):
        tid = f"T-{decision}-{uid}"
        escalated, _ = escalate(client, records, tid)
        e = escalation_of(operator, topics, escalated)
        seen, reader = replies_to(client, escalated.intent_id, "rejected")
        if decision == "discard":
            answer = operator.resolve(e.model_dump(by_alias=True), "discard", message="customer withdrew the request", timeout=30)
        else:
            answer = asyncio.run(operator.aresolve(e, "return", message="customer withdrew the request", timeout=30))
        assert isinstance(answer, RejectedReply) and answer.reason == reason and answer.message == "customer withdrew the request", answer
        reader.join(timeout=60)
        assert seen and seen[0].reason == reason, seen
        assert records.patch_requests(e.intent_key) == 0
        assert records.read("ticket", tid)["state"]["tags"] == []
    closed = operator.resolve(e, "apply", timeout=30)
    assert isinstance(closed, RejectedReply) and closed.reason == "resolution_not_applicable", closed


def _nested(levels: int) -> Any:
    """``levels`` lists, each in the next: a JSON value that deep."""
    v: Any = []
    for _ in range(levels - 1):
        v = [v]
    return v


def test_intents_at_the_owners_bounds_are_resolved(client: WritClient, operator: WritClient, records: RecordsAdmin, topics: dict[str, str], uid: str) -> None:
    """An intent exactly WRIT_MAX_JSON_DEPTH deep, and one of exactly WRIT_MAX_INTENT_BYTES as this client sends it,
    escalated: each applied (the resolution carries it one level down, and as many bytes more), written once."""

    def deepest(i: IntentInput) -> IntentInput:
        # intent → delta → operation → tags: the tags take what the three levels above them leave.
        return i.model_copy(update={"delta": [{"op": "replace", "path": "/tags", "value": ["needs-human", _nested(DEFAULT_MAX_JSON_DEPTH - 4)]}]})

    def largest(i: IntentInput) -> WriteIntent:
        def padded(pad: int) -> WriteIntent:
            return client.build_intent(i.model_copy(update={"delta": [{"op": "replace", "path": "/tags", "value": ["needs-human", "x" * pad]}]}))

        size = lambda w: len(client.codec.encode(client.intents_topic, "WriteIntent", w.to_wire()))  # noqa: E731
        w = padded(DEFAULT_MAX_INTENT_BYTES - size(padded(0)))
        assert size(w) == DEFAULT_MAX_INTENT_BYTES
        return w

    for name, shape in (("deep", deepest), ("large", largest)):
        tid = f"T-{name}-{uid}"
        escalated, _ = escalate(client, records, tid, shape)
        e = escalation_of(operator, topics, escalated)
        if name == "deep":
            assert json_depth(e.intent, 64) == DEFAULT_MAX_JSON_DEPTH
        seen, reader = replies_to(client, escalated.intent_id, "applied")
        done = operator.resolve(e, "apply", base_version=records.read("ticket", tid)["version"], timeout=30)
        assert isinstance(done, AppliedReply) and done.resolved_by == "py-ops", done
        assert records.patch_requests(e.intent_key) == 1
        reader.join(timeout=60)
        assert seen and seen[0].resolved_by == "py-ops", seen


def test_a_resolution_past_the_owners_bounds_is_refused_before_it_is_sent(operator: WritClient) -> None:
    bounds = resolution_bounds(DEFAULT_MAX_INTENT_BYTES, DEFAULT_MAX_JSON_DEPTH)
    assert (bounds.max_bytes, bounds.max_depth, bounds.delta_max_bytes, bounds.delta_max_depth) == (2 * 262_144 + 20 * 1024, 33, 262_144, 31)
    intent = {"intentKey": "a" * 64, "entity": {"type": "ticket", "id": "T-1", "note": "x" * 100}, "tool": "tag_ticket"}
    e = Escalation.model_validate(
        {"escalationId": "esc-1", "reason": "conflict_cycles_exhausted", "message": "m", "intent": intent, "cycles": 3, "current": None, "at": "2026-12-05T00:00:00.000Z"}
    )
    # The record's type and id only, whatever else the intent's entity carries.
    assert build_resolution(e, "discard", operator="ops", reply_to="r")["entity"] == {"type": "ticket", "id": "T-1"}
    # A delta one level deeper, or one byte larger, than an intent's may be.
    too_deep = [{"op": "replace", "path": "/tags", "value": _nested(bounds.delta_max_depth - 1)}]
    assert json_depth(too_deep, 64) == bounds.delta_max_depth + 1
    with pytest.raises(IntentRefused, match="its delta not sent: it is nested deeper than 31 levels") as refused:
        operator.resolve(e, "apply", base_version='"v1"', delta=too_deep, timeout=5)
    assert refused.value.code == "too_deep"
    bare = len(json.dumps([{"op": "replace", "path": "/tags", "value": ""}], separators=(",", ":")))
    too_large = [{"op": "replace", "path": "/tags", "value": "x" * (bounds.delta_max_bytes + 1 - bare)}]
    with pytest.raises(IntentRefused, match="its delta not sent: it is 262145 bytes") as refused:
        operator.resolve(e, "apply", base_version='"v1"', delta=too_large, timeout=5)
    assert refused.value.code == "too_large"
    # An escalated intent deeper, or larger, than owners admit (a forged escalation's): past the resolution's bounds.
    deep = Escalation.model_validate({**e.model_dump(by_alias=True), "intent": {**intent, "params": _nested(DEFAULT_MAX_JSON_DEPTH)}})
    with pytest.raises(IntentRefused, match="nested deeper than 33 levels"):
        operator.resolve(deep, "discard", timeout=5)
    large = Escalation.model_validate({**e.model_dump(by_alias=True), "intent": {**intent, "params": {"x": "x" * bounds.max_bytes}}})
    with pytest.raises(IntentRefused, match=f"owners refuse more than {bounds.max_bytes}"):
        operator.resolve(large, "discard", timeout=5)


def test_a_resolution_is_checked_before_it_is_sent(operator: WritClient) -> None:
    e = Escalation.model_validate(
        {
            "escalationId": "esc-1",
            "reason": "conflict_cycles_exhausted",
            "message": "m",
            "intent": {"intentKey": "a" * 64, "entity": {"type": "ticket", "id": "T-1"}, "tool": "tag_ticket"},
            "cycles": 3,
            "current": {"state": {}, "version": '"v3"'},
            "at": "2026-12-05T00:00:00.000Z",
        }
    )
    wire = build_resolution(e, "apply", operator="ops", reply_to="writ.replies.ops")
    assert wire["baseVersion"] == '"v3"' and wire["entity"] == {"type": "ticket", "id": "T-1"} and wire["operator"] == {"id": "ops"}
    assert "baseVersion" not in build_resolution(e, "discard", operator="ops", reply_to="r")
    with pytest.raises(ValueError, match="decision"):
        build_resolution(e, "approve", operator="ops", reply_to="r")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="message"):
        build_resolution(e, "return", operator="ops", reply_to="r", message="x" * 2001)
    with pytest.raises(ValueError, match="intentKey"):
        Escalation.model_validate({**e.model_dump(by_alias=True), "intent": {"intentKey": "nope", "entity": {"type": "ticket", "id": "T-1"}, "tool": "t"}})
    from writ_client import CanonicalJsonError

    with pytest.raises(CanonicalJsonError, match="not sent"):
        operator.resolve(e, "return", message="half a pair \ud83d", timeout=5)


def test_reading_escalations_skips_what_does_not_decode(stack: Stack, operator: WritClient) -> None:
    topic = f"writ.human.py-read-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": stack.brokers})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result()
    try:
        valid = {
            "escalationId": "esc-ok",
            "reason": "outcome_unknown",
            "message": "m",
            "intent": {"intentKey": "b" * 64, "entity": {"type": "ticket", "id": "T-2"}, "tool": "tag_ticket"},
            "cycles": 0,
            "current": None,
            "at": "2026-12-05T00:00:01.000Z",
            "mayHaveWritten": True,
        }
        p = Producer({"bootstrap.servers": stack.brokers})
        for partition, value, headers in (
            (0, b"{not json", None),
            (0, b"[" * 100_000, None),
            # not a time the owners' schema accepts: TypeScript skips it too
            (0, json.dumps({**valid, "escalationId": "esc-bad-at", "at": "yesterday"}).encode(), None),
            # earlier than esc-ok, though later as text: listed by time, as `writ escalations list` does
            (0, json.dumps({**valid, "escalationId": "esc-early", "at": "2026-12-05T01:00:00.5+02:00"}).encode(), None),
            (1, json.dumps({**valid, "cycles": -1}).encode(), None),
            (1, json.dumps({"heal": True}).encode(), [("writ-control", b"heal")]),
            (1, json.dumps(valid).encode(), None),
            # as deep as an owner writes one: an intent of the deepest WRIT_MAX_JSON_DEPTH (128) one level down, a
            # record state of 256 levels two down
            (
                1,
                json.dumps(
                    {**valid, "escalationId": "esc-deep", "at": "2026-12-05T00:00:02.000Z", "intent": {**valid["intent"], "params": _nested(127)}, "current": {"state": _nested(256), "version": '"2"'}}
                ).encode(),
                None,
            ),
        ):
            p.produce(topic, value=value, key=b"ticket:T-2", partition=partition, headers=headers)
        assert p.flush(30) == 0
        read = operator.read_escalations(topic=topic, timeout=60)
        assert [(r.escalation.escalation_id, r.partition, r.offset, r.escalation.may_have_written) for r in read] == [
            ("esc-early", 0, 3, True),
            ("esc-ok", 1, 2, True),
            ("esc-deep", 1, 3, True),
        ]
    finally:
        admin.delete_topics([topic])


def test_a_read_whose_position_falls_below_the_log_start_goes_on_from_the_earliest_record(stack: Stack) -> None:
    """Retention or DeleteRecords can move a partition's log start past where a read of it has got to. The read
    goes on from the earliest record still there; librdkafka's default reset, the end, would report the read
    complete with every record after the new start missed."""
    from confluent_kafka import TopicPartition

    from writ_client.escalations import _read_to_end

    topic = f"writ.py-reset-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": stack.brokers})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result()
    try:
        p = Producer({"bootstrap.servers": stack.brokers, "linger.ms": 5})
        for i in range(3000):
            p.produce(topic, value=b"x" * 1000, key=str(i).encode(), partition=0)
            if i % 500 == 0:
                p.poll(0)
        assert p.flush(30) == 0
        offsets: list[int] = []

        def take(partition: int, offset: int, key: bytes | None, value: bytes | None) -> None:
            if not offsets:
                # While the consumer has fetched only the first few records (a small fetch queue).
                for done in admin.delete_records([TopicPartition(topic, 0, 2000)]).values():
                    done.result()
            offsets.append(offset)

        small = {"bootstrap.servers": stack.brokers, "queued.max.messages.kbytes": 64, "max.partition.fetch.bytes": 16384}
        _read_to_end(small, topic, time.monotonic() + 60, 60, take, what="records")
        assert offsets[0] == 0
        assert sorted(o for o in offsets if o >= 2000) == list(range(2000, 3000))
    finally:
        admin.delete_topics([topic])


def test_open_only_keeps_the_cases_an_owner_still_takes_a_decision_on(client: WritClient, operator: WritClient, records: RecordsAdmin, topics: dict[str, str], uid: str) -> None:
    decided, waiting = (escalate(client, records, f"T-open-{n}-{uid}")[0] for n in ("a", "b"))
    ours = {decided.escalation_id, waiting.escalation_id}
    e = escalation_of(operator, topics, decided)
    answer = operator.resolve(e, "discard", message="not needed", timeout=30)
    assert isinstance(answer, RejectedReply) and answer.reason == "escalation_discarded", answer
    # Both stay on writ.human; the ledger tells the decided one from the one still waiting.
    every = {r.escalation.escalation_id for r in operator.read_escalations(timeout=60)} & ours
    assert every == ours
    still = [r for r in asyncio.run(operator.aread_escalations(open_only=True, timeout=60)) if r.escalation.escalation_id in ours]
    assert [r.escalation.escalation_id for r in still] == [waiting.escalation_id], still
    # Once decided, it is no longer open either.
    w = still[0].escalation
    done = operator.resolve(w, "apply", base_version=records.read("ticket", w.entity.id)["version"], timeout=30)
    assert isinstance(done, AppliedReply), done
    assert not [r for r in operator.read_escalations(open_only=True, timeout=60) if r.escalation.escalation_id in ours]


def test_the_ledger_lookup_takes_each_keys_latest_entry_and_passes_over_what_does_not_decode(stack: Stack, operator: WritClient) -> None:
    topic = f"writ.ledger.py-read-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": stack.brokers})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result()
    ka, kb, kc, kd = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)

    def entry(status: str, outcome: dict[str, Any] | None = None) -> bytes:
        return json.dumps({"kind": "intent", "intentKey": "x", "status": status, **({"outcome": outcome} if outcome else {})}).encode()

    escalated = {"status": "escalated", "escalationId": "esc-1", "at": "2026-12-06T00:00:00.000Z"}
    try:
        p = Producer({"bootstrap.servers": stack.brokers})
        for partition, key, value, headers in (
            (0, ka, entry("pending"), None),
            (0, ka, entry("done", escalated), None),
            (0, kb, entry("done", escalated), None),
            (0, kb, None, None),  # a tombstone: the key's entry is gone
            (1, kc, entry("done", escalated), None),
            (1, kc, b"[" * 100_000, None),  # does not decode: passed over, the entry before stands
            (1, kc, json.dumps({"kind": "intent", "status": "lost"}).encode(), None),  # not an entry: passed over
            (1, kc, None, [("writ-control", b"heal")]),  # a control record: not a tombstone
            (1, "e" * 64, entry("pending"), None),  # not asked for
        ):
            p.produce(topic, value=value, key=key.encode(), partition=partition, headers=headers)
        assert p.flush(30) == 0
        found = latest_ledger_entries(operator._conf(), operator.codec, topic, {ka, kb, kc, kd}, timeout=60)
        assert set(found) == {ka, kb, kc, kd}
        assert found[ka] is not None and found[ka].status == "done" and found[ka].outcome is not None and found[ka].outcome.escalation_id == "esc-1"
        assert found[kb] is None and found[kd] is None
        assert found[kc] is not None and found[kc].status == "done"
        e = Escalation.model_validate(
            {"escalationId": "esc-1", "reason": "conflict_cycles_exhausted", "message": "m", "cycles": 2, "current": None, "at": "2026-12-06T00:00:00.000Z",
             "intent": {"intentKey": ka, "entity": {"type": "ticket", "id": "T-1"}, "tool": "tag_ticket"}}
        )
        assert is_open(e, found[ka]) and not is_open(e, found[kb]) and not is_open(e.model_copy(update={"escalation_id": "esc-2"}), found[ka])
    finally:
        admin.delete_topics([topic])
