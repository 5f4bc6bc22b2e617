"""The client's reply thread and codec against hostile reply records, with a fake consumer: no broker needed."""

from __future__ import annotations

import concurrent.futures
import json
import struct
import threading
from typing import Any

import pytest

from writ_client import WireCodec, WritClient
from writ_client.codec import DecodeError


class FakeMsg:
    def __init__(self, value: bytes | None, offset: int) -> None:
        self._value = value
        self._offset = offset

    def error(self) -> None:
        return None

    def headers(self) -> None:
        return None

    def value(self) -> bytes | None:
        return self._value

    def topic(self) -> str:
        return "writ.replies.fake"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


class FakeConsumer:
    """Hands out its records, then blocks in poll until the client stops (no sleeping)."""

    def __init__(self, values: list[bytes | None], stop: threading.Event) -> None:
        self._msgs = [FakeMsg(v, i) for i, v in enumerate(values)]
        self._stop = stop

    def poll(self, timeout: float) -> FakeMsg | None:
        if self._msgs:
            return self._msgs.pop(0)
        self._stop.wait(timeout)
        return None


def rejected(intent_id: str, **more: Any) -> bytes:
    return json.dumps(
        {"status": "rejected", "intentId": intent_id, "intentKey": "0" * 64, "duplicate": False, "at": "2026-01-01T00:00:00.000Z",
         "reason": "params_invalid", "message": "m", **more}
    ).encode()


def run_replies(values: list[bytes | None], intent_id: str) -> tuple[Any, threading.Thread]:
    """Feeds the records to a client's reply loop; the reply the waiter for ``intent_id`` got, and the thread."""
    client = WritClient(brokers="127.0.0.1:1", agent_id="fake", reply_topic="writ.replies.fake")
    client._consumer = FakeConsumer(values, client._stop)  # type: ignore[assignment]
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    client._waiting[intent_id] = [fut]
    thread = threading.Thread(target=client._consume_loop, daemon=True)
    thread.start()
    try:
        reply = fut.result(timeout=30)
        alive = thread.is_alive()
    finally:
        client._stop.set()
        thread.join(timeout=30)
    assert alive, "the reply thread died"
    return reply, thread


@pytest.mark.parametrize(
    "hostile",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b"[" * 1000 + b"]" * 1000,
        b"1" * 5000,
        rejected("other")[:-1] + b',"details":{"n":' + b"9" * 5000 + b"}}",
        rejected("other", details=None)[:-1] + b',"details":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b"\x00\x00\x00\x00\x01{}",  # framed, no registry
        b"\xff\xfe",
    ],
    ids=["deep-array", "deep-1000", "digits", "digits-in-object", "deep-in-reply", "framed", "not-utf8"],
)
def test_a_hostile_reply_record_is_skipped_and_the_next_reply_still_arrives(hostile: bytes) -> None:
    reply, _ = run_replies([hostile, rejected("X")], "X")
    assert reply.status == "rejected" and reply.intent_id == "X"


def test_a_failure_outside_the_codec_is_skipped_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import writ_client.client as client_module

    real = client_module.parse_reply

    def flaky(value: Any) -> Any:
        if value.get("intentId") == "boom":
            raise KeyError("a bug on one record")
        return real(value)

    monkeypatch.setattr(client_module, "parse_reply", flaky)
    reply, _ = run_replies([rejected("boom"), rejected("X")], "X")
    assert reply.intent_id == "X"


def test_a_reply_holding_state_nested_256_levels_is_read() -> None:
    state: Any = 1
    for _ in range(256):
        state = {"a": state}
    applied = {
        "status": "applied", "intentId": "X", "intentKey": "0" * 64, "duplicate": False, "at": "2026-01-01T00:00:00.000Z",
        "entity": {"type": "payment", "id": "p1"}, "state": state, "version": '"v2"', "via": "patch",
    }
    reply, _ = run_replies([json.dumps(applied).encode()], "X")
    assert reply.status == "applied"


def test_decode_refuses_numbers_past_the_digit_limit_and_deep_nesting_with_a_reason() -> None:
    codec = WireCodec(None)
    with pytest.raises(DecodeError) as digits:
        codec.decode(b"1" * 5000)
    assert digits.value.reason == "undecodable"
    with pytest.raises(DecodeError) as deep:
        codec.decode(b"[" * 1000 + b"]" * 1000)
    assert deep.value.reason == "too_deep"
    with pytest.raises(DecodeError) as deep65:
        codec.decode(b"[" * 65 + b"]" * 65)
    assert deep65.value.reason == "too_deep"
    assert codec.decode(b"[" * 64 + b"]" * 64) is not None
    assert codec.decode(b"[" * 65 + b"]" * 65, max_depth=512) is not None
    # Brackets inside strings are text, not nesting.
    assert codec.decode(json.dumps({"s": "[" * 1000, "t": '\\"[' * 100}).encode()) == {"s": "[" * 1000, "t": '\\"[' * 100}


def test_schema_id_caches_stay_bounded_under_fresh_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    import writ_client.codec as codec_module

    codec = WireCodec("http://registry.invalid:1")
    asked: list[int] = []

    def fake_http(method: str, url: str, payload: bytes | None) -> tuple[int, Any]:
        schema_id = int(url.rsplit("/", 1)[1])
        asked.append(schema_id)
        return (200, {"schema": "{}"}) if schema_id % 2 == 0 else (404, {"error_code": 40403})

    monkeypatch.setattr(codec, "_http", fake_http)
    for schema_id in range(10_000):
        if schema_id % 2 == 0:
            assert codec.decode(bytes([0]) + schema_id.to_bytes(4, "big") + b"{}") == {}
        else:
            with pytest.raises(DecodeError):
                codec.decode(bytes([0]) + schema_id.to_bytes(4, "big") + b"{}")
    assert len(asked) == 10_000
    # As TypeScript's codec: the 4,096 most recent known ids, the 1,024 most recent unknown ones.
    assert len(codec._known) == 4096
    assert len(codec._unknown) == 1024
    # The most recent ids are still cached: no second question.
    asked.clear()
    assert codec.schema_id_exists(9998) is True
    assert codec.schema_id_exists(9999) is False
    assert asked == []
    # An unknown id is asked again once its answer is older than the TTL; a known one never.
    now = codec_module.time.monotonic()
    monkeypatch.setattr(codec_module.time, "monotonic", lambda: now + 31)
    assert codec.schema_id_exists(9999) is False
    assert codec.schema_id_exists(9998) is True
    assert asked == [9999]


def test_a_replies_stream_nobody_reads_holds_at_most_the_unread_bound() -> None:
    from writ_client import parse_reply

    client = WritClient(brokers="127.0.0.1:1", agent_id="fake", reply_topic="writ.replies.fake")
    stream = client.replies(idle_timeout=0.01)
    for i in range(1024 + 500):
        client._dispatch(parse_reply(json.loads(rejected(f"i{i}"))))
    assert stream._queue.qsize() == 1024  # as TypeScript's MAX_UNREAD_REPLIES
    # The newest are kept, in order.
    first = next(stream)
    assert first.intent_id == "i500"
    assert [r.intent_id for r in stream][-1] == "i1523"


def test_a_replies_stream_dropped_without_close_stops_listening() -> None:
    import gc

    from writ_client import parse_reply

    client = WritClient(brokers="127.0.0.1:1", agent_id="fake", reply_topic="writ.replies.fake")
    stream = client.replies()
    assert len(client._listeners) == 1
    del stream
    gc.collect()
    client._dispatch(parse_reply(json.loads(rejected("after"))))
    assert client._listeners == set()


def test_the_nesting_scan_is_linear_in_the_bytes() -> None:
    # An unterminated string of escaped quotes: a scan that looked for the closing quote from every quote would take minutes.
    # A hang guard, not a speed measurement: linear takes milliseconds, the quadratic scan took 227 s.
    hostile = b'["' + b'\\"' * 100_000
    outcome: list[BaseException] = []

    def decode() -> None:
        try:
            WireCodec(None).decode(hostile)
        except BaseException as e:  # noqa: BLE001 - the outcome is asserted below
            outcome.append(e)

    worker = threading.Thread(target=decode, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the nesting scan did not finish within its 60 s deadline"
    assert isinstance(outcome[0], DecodeError) and outcome[0].reason == "undecodable"


def test_a_client_without_a_registry_reads_framed_replies() -> None:
    # Owners with a registry frame their replies; a client started without one used to drop every reply.
    reply = {
        "status": "applied", "intentId": "X", "intentKey": "0" * 64, "duplicate": False, "at": "2026-01-01T00:00:00.000Z",
        "entity": {"type": "payment", "id": "p1"}, "state": {"refunds": []}, "version": '"v2"', "via": "patch",
    }
    framed = b"\x00\x00\x00\x00\x07" + json.dumps(reply).encode()
    assert WireCodec(None).decode(framed)["status"] == "applied"
    parsed, _ = run_replies([framed], "X")
    assert parsed.status == "applied"


def test_a_registry_answering_400_or_422_about_an_id_says_it_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    # Taken for an outage, such an answer held the reply partition, asked again every second, for good.
    codec = WireCodec("http://registry.invalid")
    monkeypatch.setattr(codec, "_http", lambda method, url, payload: (422 if "/-1" in url else 400, {"error_code": 42202}))
    for schema_id in (-1, 7):
        with pytest.raises(DecodeError) as err:
            codec.decode(struct.pack(">bi", 0, schema_id) + b"{}")
        assert err.value.reason == "undecodable"
