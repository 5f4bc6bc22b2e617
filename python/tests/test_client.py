"""WritClient against a real broker, registry, records server and writ owner (TypeScript, as a process)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from writ_client import (
    AppliedReply,
    BlockedOutcome,
    ClientClosed,
    ConflictReply,
    EntityRef,
    IntentInput,
    IntentRefused,
    KeyedTool,
    RejectedReply,
    UnknownOutcome,
    WritClient,
    create_input,
    partition_for,
    undo_intent_key,
)
from writ_client.devstack import RecordsAdmin, Stack

from .conftest import closed_while_waiting, make_client, owner_metric, reply_topic

REFUND = KeyedTool(name="refund_payment", key_scope="run", intent_fields=("amountCents", "reason"), free_text_params=("note",), record_type="payment")
TAG = KeyedTool(name="tag_ticket", key_scope="run", intent_fields=("tag",), record_type="ticket")
OPEN = KeyedTool(name="open_ticket", key_scope="run", intent_fields=("orderRef",), free_text_params=("subject",), record_type="ticket")


def seed_payment(records: RecordsAdmin, pid: str) -> dict[str, Any]:
    return records.seed("payment", pid, {"customer": "c-1", "amountCents": 12000, "currency": "EUR", "refunds": []})


def refund_input(pid: str, base: str, *, run: str = "run-1", step: str = "once-per-run", amount: int = 5000, note: str = "box crushed") -> IntentInput:
    return IntentInput(
        tool=REFUND,
        entity=EntityRef(type="payment", id=pid),
        run_id=run,
        step_id=step,
        tool_call_id=f"call_{uuid.uuid4().hex[:6]}",
        base_version=base,
        delta=[{"op": "add", "path": "/refunds/-", "value": {"amountCents": amount, "reason": "damaged"}}],
        params={"paymentId": pid, "amountCents": amount, "reason": "damaged", "note": note},
    )


def test_a_submit_is_applied_and_written_once(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid = f"pay_{uid}"
    seeded = seed_payment(records, pid)
    reply = client.submit(refund_input(pid, seeded["version"]), timeout=30)
    assert isinstance(reply, AppliedReply), reply
    assert reply.duplicate is False and reply.via == "patch"
    assert reply.entity.key == f"payment:{pid}"
    assert reply.state["refunds"] == [{"amountCents": 5000, "reason": "damaged"}]
    # The owner recomputed the key from the intent's own fields and accepted it; the records server counts one write.
    assert reply.intent_key == client.intent_key(tool=REFUND, run_id="run-1", step_id="once-per-run", entity={"type": "payment", "id": pid}, params={"amountCents": 5000, "reason": "damaged"})
    assert len(records.read("payment", pid)["state"]["refunds"]) == 1
    assert records.patch_requests(reply.intent_key) == 1


def test_a_duplicate_submit_is_answered_from_the_ledger_with_one_patch(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid = f"pay_{uid}"
    seeded = seed_payment(records, pid)
    first = client.submit(refund_input(pid, seeded["version"], note="first wording"), timeout=30)
    # A retry: new intent id and tool-call id, the model reworded the free text; same business intent.
    second = client.submit(refund_input(pid, seeded["version"], note="reworded on retry"), timeout=30)
    assert isinstance(first, AppliedReply) and isinstance(second, AppliedReply)
    assert first.intent_id != second.intent_id and first.intent_key == second.intent_key
    assert (first.duplicate, second.duplicate) == (False, True)
    assert second.version == first.version
    assert len(records.read("payment", pid)["state"]["refunds"]) == 1
    assert records.patch_requests(first.intent_key) == 1


def test_a_stale_base_is_a_conflict_with_the_current_record(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    tid = f"T-{uid}"
    read = records.seed("ticket", tid, {"subject": "Charged twice", "status": "open", "tags": ["billing"]})
    # Someone else writes after the agent read "v1".
    now = records.seed("ticket", tid, {"subject": "Charged twice", "status": "open", "tags": ["billing", "chargeback-risk"]})
    delta = [{"op": "replace", "path": "/tags", "value": ["billing", "vip"]}]
    reply = client.submit(
        IntentInput(tool=TAG, entity=EntityRef(type="ticket", id=tid), run_id="run-1", step_id="s1", base_version=read["version"], delta=delta, params={"ticketId": tid, "tag": "vip"}),
        timeout=30,
    )
    assert isinstance(reply, ConflictReply), reply
    assert reply.cycle == 1
    assert reply.current.version == now["version"]
    assert reply.current.state["tags"] == ["billing", "chargeback-risk"]
    assert [op.model_dump(by_alias=True) for op in reply.your_change] == delta
    assert records.read("ticket", tid)["version"] == now["version"]


def test_plain_json_and_framed_values_are_both_answered(client: WritClient, plain_client: WritClient, records: RecordsAdmin, uid: str) -> None:
    assert client.codec.framed and not plain_client.codec.framed
    results = []
    for c, pid in ((client, f"pay_f_{uid}"), (plain_client, f"pay_p_{uid}")):
        seeded = seed_payment(records, pid)
        intent = c.build_intent(refund_input(pid, seeded["version"]))
        value = c.codec.encode(c.intents_topic, "WriteIntent", intent.to_wire())
        assert value[0] == (0 if c.codec.framed else ord("{"))
        results.append(c.submit(intent, timeout=30))
    assert [r.status for r in results] == ["applied", "applied"], results
    assert all(not r.duplicate for r in results)


def test_owners_refuse_an_intent_key_built_from_other_intent_fields(plain_client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid = f"pay_{uid}"
    seeded = seed_payment(records, pid)
    wrong = REFUND.model_copy(update={"intent_fields": ("amountCents",)})
    i = refund_input(pid, seeded["version"]).model_copy(update={"tool": wrong})
    reply = plain_client.submit(i, timeout=30)
    assert isinstance(reply, RejectedReply) and reply.reason == "intent_key_mismatch", reply
    assert records.read("payment", pid)["state"]["refunds"] == []


def test_invalid_params_are_rejected(plain_client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid = f"pay_{uid}"
    seeded = seed_payment(records, pid)
    i = refund_input(pid, seeded["version"])
    i = i.model_copy(update={"params": {**i.params, "reason": "because"}})
    reply = plain_client.submit(i, timeout=30)
    assert isinstance(reply, RejectedReply) and reply.reason == "params_invalid", reply


def test_replies_yields_every_reply_on_the_topic(plain_client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid = f"pay_{uid}"
    seeded = seed_payment(records, pid)
    with plain_client.replies(idle_timeout=30) as stream:
        reply = plain_client.submit(refund_input(pid, seeded["version"]), timeout=30)
        got = next(stream)
    assert got.intent_id == reply.intent_id and got.status == "applied"


def test_submit_all_answers_each_intent(plain_client: WritClient, records: RecordsAdmin, uid: str) -> None:
    inputs = []
    for n in range(3):
        pid = f"pay_{uid}_{n}"
        inputs.append(refund_input(pid, seed_payment(records, pid)["version"]))
    replies = plain_client.submit_all(inputs, timeout=30)
    assert [r.status for r in replies] == ["applied"] * 3
    assert [r.entity.id for r in replies] == [i.entity.id for i in inputs]


@contextlib.contextmanager
def unanswered_client(stack: Stack, uid: str) -> Iterator[WritClient]:
    """A started client whose intents go to a topic of their own that no owner reads: no reply ever comes."""
    idle = f"writ.intents.py-idle-{uid}"
    admin = AdminClient({"bootstrap.servers": stack.brokers})
    admin.create_topics([NewTopic(idle, num_partitions=1, replication_factor=1)])[idle].result()
    try:
        with WritClient(brokers=stack.brokers, agent_id=f"py-idle-{uid}", reply_topic=reply_topic(f"py-idle-{uid}"), intents_topic=idle) as c:
            yield c
    finally:
        admin.delete_topics([idle])


def test_no_owner_means_unknown_at_the_deadline(stack: Stack, uid: str) -> None:
    with unanswered_client(stack, uid) as c:
        t0 = time.monotonic()
        result = c.submit(refund_input(f"pay_{uid}", '"v1"'), timeout=1.5)
        assert isinstance(result, UnknownOutcome), result
        assert 1.4 < time.monotonic() - t0 < 15
        assert "may or may not" in result.message


def test_close_ends_a_submit_waiting_for_a_reply_that_never_comes(stack: Stack, uid: str) -> None:
    # Its deadline an hour off: close() ends it at once, unknown with reason client_closed (TypeScript's close()).
    with unanswered_client(stack, uid) as c:
        result = closed_while_waiting(c, c.build_intent(refund_input(f"pay_{uid}", '"v1"')))
        assert isinstance(result, UnknownOutcome) and result.reason == "client_closed", result
        with pytest.raises(ClientClosed):
            c.submit(refund_input(f"pay_{uid}", '"v1"', run="after-close"), timeout=3600)


def test_a_reply_partition_held_by_an_open_transaction_is_blocked(stack: Stack, topics: dict[str, str], owner: Any, records: RecordsAdmin, uid: str) -> None:
    c = make_client(stack, topics, f"py-hang-{uid}", framed=False, reply_topic_partitions=3)
    hanging = Producer({"bootstrap.servers": stack.brokers, "transactional.id": f"py-hang-{uid}", "transaction.timeout.ms": 60000})
    try:
        pid = f"pay_{uid}"
        seeded = seed_payment(records, pid)
        intent = c.build_intent(refund_input(pid, seeded["version"]))
        # Hold the partition the owner will answer on (murmur2 of the intent id), and only that one.
        held = partition_for(intent.intent_id, 3)
        hanging.init_transactions(30)
        hanging.begin_transaction()
        hanging.produce(c.reply_topic, key=b"x", value=b"{}", partition=held)
        hanging.flush(10)
        result = c.submit(intent, timeout=4)
        assert isinstance(result, BlockedOutcome), result
        assert result.topic == c.reply_topic and result.partition == held
        assert "blocked by an open transaction" in result.message
        # The owner did answer: its reply is behind the open transaction, and the write happened once. Waited for:
        # the outcome above is the client's at its deadline, whether or not the owner has written by then.
        deadline = time.monotonic() + 30
        while not records.read("payment", pid)["state"]["refunds"]:
            assert time.monotonic() < deadline, "the owner wrote nothing within 30 s"
            time.sleep(0.1)
        assert len(records.read("payment", pid)["state"]["refunds"]) == 1
    finally:
        hanging.abort_transaction(30)
        c.close()


def test_partitions_match_kafkajs_for_the_vector_keys(stack: Stack, client: WritClient, vectors: dict[str, Any], uid: str) -> None:
    """librdkafka's murmur2_random, as the client configures it, puts every vector key where kafkajs's DefaultPartitioner does."""
    n = vectors["partitioner"]["partitions"]
    topic = f"writ.py-partitions-{uid}"
    admin = AdminClient({"bootstrap.servers": stack.brokers})
    admin.create_topics([NewTopic(topic, num_partitions=n, replication_factor=1)])[topic].result()
    try:
        deadline = time.monotonic() + 20
        while len(admin.list_topics(topic, timeout=5).topics[topic].partitions or {}) < n:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        producer = Producer(client.producer_config())
        landed: dict[str, int] = {}
        lock = threading.Lock()

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            with lock:
                landed[msg.key().decode("utf-8")] = msg.partition()

        # (a vector refused as not_canonical has no expected entity key)
        with_keys = [v for v in vectors["vectors"] if "entityKey" in v["expected"]]
        keys = [k["key"] for k in vectors["partitioner"]["keys"]] + [v["expected"]["entityKey"] for v in with_keys]
        for key in keys:
            producer.produce(topic, key=key.encode("utf-8"), value=b"{}", on_delivery=delivered)
        assert producer.flush(30) == 0
        for k in vectors["partitioner"]["keys"]:
            assert landed[k["key"]] == k["partition"], k["key"]
            assert partition_for(k["key"], n) == k["partition"]
        for v in with_keys:
            assert landed[v["expected"]["entityKey"]] == v["expected"]["partition"], v["name"]
    finally:
        admin.delete_topics([topic])


def test_a_value_with_no_canonical_form_is_refused_before_anything_is_sent(plain_client: WritClient, records: RecordsAdmin, uid: str) -> None:
    """As the TypeScript client: owners would refuse it (not_canonical), so submit() raises and nothing waits or is sent."""
    from writ_client import CanonicalJsonError

    pid = f"pay_{uid}"
    seeded = seed_payment(records, pid)
    for note in ("broken \ud800 text", float("nan"), float("inf")):
        with pytest.raises(CanonicalJsonError) as err:
            plain_client.submit(refund_input(pid, seeded["version"], note=note), timeout=5)  # type: ignore[arg-type]
        assert err.value.code == "not_canonical" and "/params/note" in str(err.value)
    assert plain_client._waiting == {}
    # the next intent goes through as usual, and was the only one sent
    reply = plain_client.submit(refund_input(pid, seeded["version"]), timeout=30)
    assert isinstance(reply, AppliedReply) and reply.duplicate is False, reply


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def wait_for_dead_letters(owner: Any, reason: str, above: float) -> float:
    deadline = time.monotonic() + 30
    while (count := owner_metric(owner, "writ_dead_letters_total", reason=reason)) <= above:
        assert time.monotonic() < deadline, f"no {reason} dead letter within 30 s"
        time.sleep(0.1)
    return count


def test_an_intent_over_the_owners_admission_bounds_is_refused_before_anything_is_sent(
    stack: Stack, topics: dict[str, str], owner: Any, records: RecordsAdmin, uid: str
) -> None:
    """Owners dead-letter an intent nested deeper than WRIT_MAX_JSON_DEPTH (32) or larger than WRIT_MAX_INTENT_BYTES
    (262,144 encoded) without a reply: sent, it could only come back unknown, every time it is asked again. The
    client refuses it first, as the TypeScript client does, at the owners' own bounds."""
    pid = f"pay_{uid}"
    seeded = seed_payment(records, pid)

    def deep(levels: int, run: str) -> IntentInput:
        # The intent object is depth 1, its delta 2, the op 3: the value adds `levels`.
        intent = refund_input(pid, seeded["version"], run=run)
        return intent.model_copy(update={"delta": [{"op": "add", "path": "/refunds/-", "value": nested(levels)}]})

    big = refund_input(pid, seeded["version"], run=f"big-{uid}", note="x" * 300_000)
    client = make_client(stack, topics, f"bounds-{uid}")
    loose = make_client(stack, topics, f"loose-{uid}", max_json_depth=64, max_intent_bytes=900_000)
    try:
        for intent, code in ((deep(30, f"deep-{uid}"), "too_deep"), (big, "too_large")):
            with pytest.raises(IntentRefused) as err:
                client.submit(intent, timeout=5)
            assert err.value.code == code
        assert client._waiting == {}
        # At the bound the owner answers (whatever it decides: the refund's shape is not a nested list).
        at_bound = client.submit(deep(29, f"edge-{uid}"), timeout=30)
        assert not isinstance(at_bound, UnknownOutcome), at_bound
        # Control: a client told the owners take more sends them, and each is dead-lettered without an answer.
        for intent, reason in ((deep(30, f"deep-{uid}"), "too_deep"), (big, "too_large")):
            before = owner_metric(owner, "writ_dead_letters_total", reason=reason)
            assert isinstance(loose.submit(intent, timeout=4), UnknownOutcome)
            wait_for_dead_letters(owner, reason, before)
        # Neither reached the system of record.
        for intent in (deep(30, f"deep-{uid}"), big):
            assert records.patch_requests(loose.build_intent(intent).intent_key) == 0
    finally:
        client.close()
        loose.close()


def test_replies_is_an_async_iterator_too(plain_client: WritClient, records: RecordsAdmin, uid: str) -> None:
    import asyncio

    pid = f"pay_{uid}"
    seeded = seed_payment(records, pid)

    async def flow() -> tuple[Any, Any]:
        stream = plain_client.replies(idle_timeout=30)
        reply = await plain_client.asubmit(refund_input(pid, seeded["version"]), timeout=30)
        async for got in stream:
            stream.close()
            return reply, got
        raise AssertionError("no reply")

    reply, got = asyncio.run(flow())
    assert reply.status == "applied" and got.intent_id == reply.intent_id


def test_the_owner_never_had_to_forward_an_intent(owner: Any) -> None:
    """Runs after the tests above: every intent produced here landed on its key's murmur2 partition and found its reply topic."""
    log = owner.log_tail(10_000_000)
    assert "intent answered at admission" in log or "partition restored" in log  # the log is the owner's
    assert owner_metric(owner, "writ_forwarded_total") == 0
    # Owners ask the cluster again about a reply topic they have not seen (on every intent): a client's first intent,
    # sent right after it created its reply topic, is answered there, never only dead-lettered.
    assert '"reason":"reply_topic_missing"' not in log


def test_an_undo_compensates_an_applied_write_once_whoever_submits_it(client: WritClient, plain_client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid = f"pay_u_{uid}"
    seeded = seed_payment(records, pid)
    write = client.submit(refund_input(pid, seeded["version"]), timeout=30)
    assert isinstance(write, AppliedReply) and write.tool == "refund_payment", write
    undone = client.undo(write, timeout=30)
    assert isinstance(undone, AppliedReply), undone
    assert (undone.duplicate, undone.undo_of, undone.intent_key) == (False, write.intent_key, undo_intent_key(write.intent_key))
    # The tool's declared compensating change, on the version the write produced: a reversal naming the refund.
    assert records.read("payment", pid)["state"]["reversals"] == [{"reverses": write.intent_key, "amountCents": 5000, "reason": "damaged"}]
    # Again: by another agent naming the write, and by this one by its key alone. One undo, answered from the ledger.
    again = asyncio.run(plain_client.aundo({"intentKey": write.intent_key, "entity": {"type": "payment", "id": pid}, "tool": "refund_payment"}, timeout=30))
    by_key = client.undo(write.intent_key, run_id="another-run", timeout=30)
    assert isinstance(again, AppliedReply) and isinstance(by_key, AppliedReply), (again, by_key)
    assert (again.duplicate, by_key.duplicate, again.intent_key, by_key.intent_key) == (True, True, undone.intent_key, undone.intent_key)
    # Counted at the records server (its own Idempotency-Key dedupe off): one compensating PATCH, one reversal.
    assert records.patch_requests(undone.intent_key) == 1
    assert len(records.read("payment", pid)["state"]["reversals"]) == 1


def test_an_operator_undoes_a_write_by_its_key_alone_from_the_ledger(client: WritClient, plain_client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid = f"pay_ul_{uid}"
    seeded = seed_payment(records, pid)
    write = client.submit(refund_input(pid, seeded["version"]), timeout=30)
    assert isinstance(write, AppliedReply), write
    # Another client (an operator's, as `writ undo <key>`) knows only the key: the ledger names the record and tool.
    with pytest.raises(ValueError, match="was not submitted by this client"):
        plain_client.build_undo(write.intent_key)
    undone = plain_client.undo(write.intent_key, from_ledger=True, timeout=30)
    assert isinstance(undone, AppliedReply) and (undone.undo_of, undone.entity.key, undone.duplicate) == (write.intent_key, f"payment:{pid}", False), undone
    assert records.read("payment", pid)["state"]["reversals"] == [{"reverses": write.intent_key, "amountCents": 5000, "reason": "damaged"}]
    assert records.patch_requests(undone.intent_key) == 1
    with pytest.raises(ValueError, match="is not in"):
        plain_client.undo("0" * 64, from_ledger=True)


def test_an_undo_of_a_write_that_was_not_applied_is_rejected_and_writes_nothing(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    tid = f"T-u-{uid}"
    read = records.seed("ticket", tid, {"subject": "Late", "status": "open", "tags": []})
    now = records.seed("ticket", tid, {"subject": "Late", "status": "open", "tags": ["vip"]})
    stale = IntentInput(tool=TAG, entity=EntityRef(type="ticket", id=tid), run_id="run-1", step_id="s1", base_version=read["version"],
                        delta=[{"op": "replace", "path": "/tags", "value": ["late"]}], params={"tag": "late"})
    conflict = client.submit(stale, timeout=30)
    assert isinstance(conflict, ConflictReply), conflict
    with pytest.raises(ValueError, match="cannot undo a ConflictReply"):
        client.undo(conflict)  # type: ignore[arg-type]
    # By its key (this client submitted it): the owner refuses it, nothing to undo.
    refused = client.undo(conflict.intent_key, timeout=30)
    assert isinstance(refused, RejectedReply) and refused.reason == "undo_target_not_applied", refused
    assert records.read("ticket", tid)["version"] == now["version"]
    assert records.patch_requests(undo_intent_key(conflict.intent_key)) == 0
    with pytest.raises(ValueError, match="was not submitted by this client"):
        client.undo("0" * 64)


def test_a_create_makes_the_record_once_per_external_id(client: WritClient, plain_client: WritClient, records: RecordsAdmin, uid: str) -> None:
    ref = f"ORD-{uid}"
    body = {"subject": "Damaged on arrival", "status": "open", "tags": [], "orderRef": ref}

    def opening(run: str) -> IntentInput:
        return create_input(OPEN, external_id=ref, body=body, params={"orderRef": ref, "subject": "Damaged on arrival"}, run_id=run, step_id="open-1")

    first = client.submit(opening("run-1"), timeout=30)
    assert isinstance(first, AppliedReply), first
    assert (first.via, first.duplicate, first.entity.key) == ("create", False, f"ticket:{ref}")
    # The same create again (a retry): answered from the ledger. Another agent's create of the same id: a conflict carrying the record.
    again = client.submit(opening("run-1"), timeout=30)
    other = plain_client.submit(opening("run-2"), timeout=30)
    assert isinstance(again, AppliedReply) and again.duplicate, again
    assert isinstance(other, ConflictReply) and other.current.state == body, other
    assert records.read("ticket", ref)["state"] == body
    assert records.put_requests(first.intent_key) == 1
    with pytest.raises(ValueError, match="has no record_type"):
        create_input(KeyedTool(name="open_ticket", key_scope="run", intent_fields=("orderRef",)), external_id=ref, body=body, params={"orderRef": ref}, run_id="r", step_id="s")
