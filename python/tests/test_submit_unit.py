"""submit()/submit_all() with a fake producer and fake end-offset probes: no broker needed."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from writ_client import CanonicalJsonError, ClientClosed, EntityRef, IntentInput, IntentRefused, KeyedTool, UnknownOutcome, WritClient, intent_key, parse_reply
from writ_client.client import _Ends

from .conftest import closed_while_waiting

TOOL = KeyedTool(name="t", key_scope="run", intent_fields=("a",))


class FakeProducer:
    """Records what was produced; delivers at once unless told to fail."""

    def __init__(self) -> None:
        self.produced: list[tuple[bytes, bytes]] = []

    def produce(self, topic: str, *, value: bytes, key: bytes, headers: Any, on_delivery: Any) -> None:
        if len(key) + len(value) > 1_000_000:  # librdkafka's check against message.max.bytes
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "message too large"))
        self.produced.append((key, value))
        on_delivery(self.delivery_error(key), None)

    def delivery_error(self, key: bytes) -> KafkaError | None:
        return None

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
    results = client.submit_all([intent_input(f"x{i}") for i in range(8)], timeout=0.1)
    assert [r.status for r in results] == ["blocked"] * 8
    # One probe as the wait begins, one fresh one at the deadline for the whole batch (not one per intent).
    assert len(probes) == 2


class RefusingProducer(FakeProducer):
    """Refuses the record of one entity synchronously, as librdkafka refuses a record it cannot queue."""

    def __init__(self, refuse: bytes, reply: Any = None) -> None:
        super().__init__()
        self.refuse = refuse
        self.reply = reply

    def produce(self, topic: str, *, value: bytes, key: bytes, headers: Any, on_delivery: Any) -> None:
        if key == self.refuse:
            raise KafkaException(KafkaError(KafkaError._QUEUE_FULL, "queue full"))
        super().produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
        if self.reply is not None:
            self.reply(json.loads(value))


def test_a_record_over_message_max_bytes_is_refused_before_any_intent_is_sent() -> None:
    producer = FakeProducer()
    # Owners told to take more than the producer's message.max.bytes: that is the bound that refuses it.
    client = started_client(producer, max_intent_bytes=2_000_000)
    with pytest.raises(KafkaException) as err:
        client.submit_all([intent_input("small"), intent_input("big", value="x" * 1_100_000)], timeout=5)
    assert err.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert producer.produced == [] and client._waiting == {}


def test_a_send_failing_partway_through_a_batch_gives_each_intent_its_outcome() -> None:
    client = started_client()

    def answer(intent: dict[str, Any]) -> None:
        client._dispatch(parse_reply({
            "status": "rejected", "intentId": intent["intentId"], "intentKey": intent["intentKey"], "duplicate": False,
            "at": "2026-01-01T00:00:00.000Z", "reason": "params_invalid", "message": "m",
        }))

    producer = RefusingProducer(b"t:second", reply=answer)
    client._producer = producer
    results = client.submit_all([intent_input("first"), intent_input("second"), intent_input("third")], timeout=5)
    # The first was sent and answered; the others were never handed to the producer.
    assert [k for k, _ in producer.produced] == [b"t:first"]
    assert results[0].status == "rejected"
    assert [r.status for r in results[1:]] == ["unknown", "unknown"]
    assert all("Not sent" in r.message for r in results[1:])
    assert client._waiting == {}


def test_a_send_failing_on_the_first_intent_raises() -> None:
    producer = RefusingProducer(b"t:first")
    client = started_client(producer)
    with pytest.raises(KafkaException):
        client.submit_all([intent_input("first"), intent_input("second")], timeout=5)
    assert producer.produced == [] and client._waiting == {}


def test_a_delivery_failing_for_one_intent_of_a_batch_is_unknown_and_the_others_keep_their_replies() -> None:
    client = started_client()

    class FailingDelivery(RefusingProducer):
        def delivery_error(self, key: bytes) -> KafkaError | None:
            return KafkaError(KafkaError._MSG_TIMED_OUT, "timed out") if key == b"t:second" else None

    client._producer = FailingDelivery(b"none", reply=lambda intent: client._dispatch(parse_reply({
        "status": "rejected", "intentId": intent["intentId"], "intentKey": intent["intentKey"], "duplicate": False,
        "at": "2026-01-01T00:00:00.000Z", "reason": "params_invalid", "message": "m",
    })) if intent["entity"]["id"] != "second" else None)
    results = client.submit_all([intent_input("first"), intent_input("second"), intent_input("third")], timeout=5)
    assert [r.status for r in results] == ["rejected", "unknown", "rejected"]
    assert "The send failed" in results[1].message


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def test_the_owners_admission_bounds_are_checked_before_any_intent_is_sent() -> None:
    producer = FakeProducer()
    client = started_client(producer)
    # The intent object is depth 1, its delta 2, an op 3: a value of 29 levels is at the owners' 32.
    for big, code in ((intent_input("deep", value=nested(30)), "too_deep"), (intent_input("big", value="x" * 300_000), "too_large")):
        with pytest.raises(IntentRefused) as err:
            client.submit_all([intent_input("small"), big], timeout=5)
        assert err.value.code == code
    assert producer.produced == [] and client._waiting == {}
    client.submit_all([intent_input("edge", value=nested(29))], timeout=0.2)
    assert len(producer.produced) == 1
    # Owners configured for more: the client is told so.
    roomy = started_client(producer, max_json_depth=40, max_intent_bytes=400_000)
    roomy.submit_all([intent_input("deep", value=nested(30)), intent_input("big", value="x" * 300_000)], timeout=0.2)
    assert len(producer.produced) == 3


def test_the_admission_bounds_come_from_the_owners_variables() -> None:
    env = {"KAFKA_BROKERS": "127.0.0.1:1", "WRIT_MAX_INTENT_BYTES": "524288", "WRIT_MAX_JSON_DEPTH": "48"}
    client = WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env=env)
    assert (client.max_intent_bytes, client.max_json_depth) == (524288, 48)
    for bad in ("0", "64k", "-1"):
        with pytest.raises(ValueError, match="WRIT_MAX_JSON_DEPTH"):
            WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env={**env, "WRIT_MAX_JSON_DEPTH": bad})
    with pytest.raises(ValueError, match="max_intent_bytes"):
        WritClient(brokers="127.0.0.1:1", agent_id="a", reply_topic="writ.replies.a", max_intent_bytes=0)


def test_an_undo_by_a_key_that_is_not_one_is_refused_before_the_ledger_is_read() -> None:
    client = started_client()
    with pytest.raises(ValueError, match="64 lower-case hex"):
        client.build_undo("not-a-key", from_ledger=True, timeout=0.5)


def rejected(intent: dict[str, Any], reason: str) -> Any:
    return parse_reply({
        "status": "rejected", "intentId": intent["intentId"], "intentKey": intent["intentKey"], "duplicate": False,
        "at": "2026-01-01T00:00:00.000Z", "reason": reason, "message": "m",
    })


def test_a_rejection_given_before_signature_checks_gives_way_to_the_intents_own_answer() -> None:
    client = started_client()

    def answer(intent: dict[str, Any]) -> None:
        # A forged, unsigned record naming this intent id is answered first; then the signed intent is applied.
        client._dispatch(rejected(intent, "unauthenticated"))
        client._dispatch(parse_reply({
            "status": "applied", "intentId": intent["intentId"], "intentKey": intent["intentKey"], "duplicate": False,
            "at": "2026-01-01T00:00:00.000Z", "entity": {"type": "t", "id": intent["entity"]["id"]}, "version": '"v2"', "via": "patch",
        }))

    client._producer = RefusingProducer(b"none", reply=answer)
    result = client.submit(intent_input(), timeout=5)
    assert result.status == "applied"
    assert client._waiting == {} and client._provisional == {}


def test_a_lone_provisional_rejection_is_the_result_at_the_deadline() -> None:
    client = started_client()
    client._producer = RefusingProducer(b"none", reply=lambda intent: client._dispatch(rejected(intent, "key_mismatch")))
    began = time.monotonic()
    result = client.submit(intent_input(), timeout=0.3)
    assert time.monotonic() - began >= 0.3  # it waited for another answer
    assert result.status == "rejected" and result.reason == "key_mismatch"
    assert "not this client's" in result.message
    assert client._waiting == {} and client._provisional == {}


def test_a_refusal_for_the_audience_settles_a_submit_at_once() -> None:
    # Given only once the signature verified: final. Other unauthenticated refusals, and look-alike details, are held.
    client = started_client()

    def answer(intent: dict[str, Any]) -> None:
        client._dispatch(rejected(intent, "unauthenticated"))
        look_alike = rejected(intent, "unauthenticated").model_copy(update={"details": {"problem": ["audience_mismatch"]}})
        client._dispatch(look_alike)
        client._dispatch(rejected(intent, "unauthenticated").model_copy(update={"details": {"problem": "audience_mismatch", "received": "staging"}}))

    client._producer = RefusingProducer(b"none", reply=answer)
    result = client.submit(intent_input(), timeout=30)
    assert result.status == "rejected" and result.reason == "unauthenticated"
    assert result.details == {"problem": "audience_mismatch", "received": "staging"}
    assert "not this client's" not in result.message
    assert client._waiting == {} and client._provisional == {}


def test_an_ordinary_rejection_still_settles_a_submit_at_once() -> None:
    client = started_client()
    client._producer = RefusingProducer(b"none", reply=lambda intent: client._dispatch(rejected(intent, "params_invalid")))
    result = client.submit(intent_input(), timeout=5)
    # Its own message: one held to the deadline would say it may not be this client's.
    assert result.status == "rejected" and result.reason == "params_invalid" and result.message == "m"


def applied(intent: dict[str, Any]) -> Any:
    return parse_reply({
        "status": "applied", "intentId": intent["intentId"], "intentKey": intent["intentKey"], "duplicate": False,
        "at": "2026-01-01T00:00:00.000Z", "entity": {"type": "t", "id": intent["entity"]["id"]}, "version": '"v2"', "via": "patch",
    })


def test_a_submission_that_ends_leaves_another_waiting_on_the_same_intent_id_its_reply() -> None:
    # The same WriteIntent submitted again while an earlier submission of it still waits (a retry layer, an asyncio
    # wait_for that gave up on the worker thread): the earlier one ending must not take the later one's waiter with it.
    client = started_client()
    intent = client.build_intent(intent_input())
    later: dict[str, Any] = {}
    waiting = threading.Thread(target=lambda: later.setdefault("result", client.submit(intent, timeout=10)))
    waiting.start()
    deadline = time.monotonic() + 10
    while intent.intent_id not in client._waiting:
        assert time.monotonic() < deadline, "the first submission never waited"
        time.sleep(0.01)
    earlier = client.submit(intent, timeout=0.2)
    assert earlier.status == "unknown"
    client._dispatch(applied(intent.to_wire()))
    waiting.join(15)
    assert later["result"].status == "applied"
    assert client._waiting == {} and client._provisional == {}


def test_one_intent_twice_in_a_batch_gets_its_reply_in_both_places() -> None:
    client = started_client()
    intent = client.build_intent(intent_input())
    answered: list[str] = []

    def answer(wire: dict[str, Any]) -> None:
        if not answered:  # one reply for the intent id, as the ledger would give the repeat the same outcome
            answered.append(wire["intentId"])
            client._dispatch(applied(wire))

    client._producer = RefusingProducer(b"none", reply=answer)
    results = client.submit_all([intent, intent], timeout=5)
    assert [r.status for r in results] == ["applied", "applied"]
    assert client._waiting == {} and client._provisional == {}


def test_close_ends_a_waiting_submit_at_once_unknown_client_closed_and_refuses_later_ones() -> None:
    # A submit whose reply never comes, its deadline an hour off: close() ends it now (as TypeScript's close() does),
    # an outcome (the write may have happened), not an error and not the deadline's probe of the reply partitions,
    # whose executor close() shuts down.
    producer = FakeProducer()
    producer.flush = lambda timeout: 0  # type: ignore[attr-defined]
    client = started_client(producer)
    intent = client.build_intent(intent_input())
    result = closed_while_waiting(client, intent)
    assert isinstance(result, UnknownOutcome) and result.reason == "client_closed", result
    assert result.intent_id == intent.intent_id and "This client was closed" in result.message
    assert client._waiting == {} and client._provisional == {}
    # Later ones are refused before anything is sent, with the typed error.
    with pytest.raises(ClientClosed) as refused:
        client.submit(intent_input(), timeout=3600)
    assert refused.value.code == "client_closed" and not refused.value.retriable
    assert len(producer.produced) == 1


def test_close_between_registering_the_waiters_and_producing_raises_client_closed_and_sends_nothing() -> None:
    # close() runs to its end (the producer dropped) after _exchange registered its waiters and released the lock,
    # before _produce: it used to fail `assert self._producer is not None` (AttributeError under -O).
    producer = FakeProducer()
    producer.flush = lambda timeout: 0  # type: ignore[attr-defined]
    client = started_client(producer)
    produce = client._produce

    def closed_first(*args: Any) -> Any:
        assert client._waiting, "the waiters are registered"
        client.close()
        assert client._producer is None
        return produce(*args)

    client._produce = closed_first  # type: ignore[method-assign]
    with pytest.raises(ClientClosed) as refused:
        client.submit(intent_input(), timeout=3600)
    assert refused.value.code == "client_closed"
    assert producer.produced == [] and client._waiting == {}


def test_an_int_enum_param_is_sent_and_keyed_as_its_value() -> None:
    import enum

    class Level(int, enum.Enum):
        LOW = 1

    producer = FakeProducer()
    client = started_client(producer)
    tool = KeyedTool(name="t", key_scope="run", intent_fields=("a",))
    result = client.submit(intent_input(tool=tool, params={"a": Level.LOW}), timeout=0.1)
    assert result.status == "unknown"  # sent, not refused (it raised JSONDecodeError before anything was sent)
    sent = json.loads(producer.produced[0][1])
    assert sent["params"] == {"a": 1}
    # The owner recomputes the key from what it parses: the key the client sent.
    assert intent_key(tool=tool, agent_id="a", run_id="r", step_id="s", entity=sent["entity"], params=sent["params"]) == sent["intentKey"]


def test_the_backoff_between_rounds_stays_at_two_seconds_however_many_rounds_a_long_wait_takes() -> None:
    # A write answered `leased` for half an hour is asked again some 1,000 times: 2**1024 has no float.
    from writ_client.client import backoff_until

    deadline = time.monotonic() + 60
    for round_ in (0, 10, 1023, 1024, 5000):
        assert 0.0 <= backoff_until(round_, deadline) <= 2.4
