"""start() with a fake AdminClient: a refused login ends the start once it stands, not at the reply topic request's
timeout; one that passes, or that only some brokers make, leaves the start to go on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import writ_client.client as client_module
from writ_client import KafkaSecurity, WritClient

REFUSED = "sasl_ssl://127.0.0.1:1/bootstrap: SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"


class NeverAnswered:
    """The create-topics future of a broker that refuses the login: librdkafka tries again until the request's
    timeout, then fails it with _TIMED_OUT (which result() gives at once here, as if that time had passed)."""

    def done(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> None:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed while waiting for controller: Local: Timed out"))


class Clock:
    """The client module's time: each poll(timeout) of a fake admin lets that much pass, no one waits."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(client_module, "time", SimpleNamespace(monotonic=c.monotonic, sleep=c.sleep))
    return c


class Answered:
    """The create-topics future of a request done after ``polls`` polls of its admin."""

    def __init__(self, admin: Any, polls: int) -> None:
        self.admin = admin
        self.polls = polls

    def done(self) -> bool:
        return self.admin.polls >= self.polls

    def result(self, timeout: float | None = None) -> None:
        return None


class RefusingAdmin:
    """An AdminClient whose every poll serves error_cb the broker's refusal of the login."""

    clock: Clock | None = None

    def __init__(self, conf: dict[str, Any]) -> None:
        self.error_cb = conf["error_cb"]
        self.polls = 0

    def create_topics(self, topics: list[Any], request_timeout: float) -> dict[str, Any]:
        return {t.topic: NeverAnswered() for t in topics}

    def poll(self, timeout: float) -> int:
        self.polls += 1
        if self.clock is not None:
            self.clock.now += timeout
        self.refuse()
        return 0

    def refuse(self) -> None:
        self.error_cb(KafkaError(KafkaError._AUTHENTICATION, REFUSED))


class RefusingOnceAdmin(RefusingAdmin):
    """librdkafka's way: each broker in ``refusing`` reports its refusal once (an identical one again only after
    30 s); the request is done after ``done_after`` polls (the login passed, or went through another broker)."""

    refusing: tuple[str, ...] = ("sasl_ssl://127.0.0.1:1/bootstrap",)
    done_after = 50

    def create_topics(self, topics: list[Any], request_timeout: float) -> dict[str, Any]:
        return {t.topic: Answered(self, self.done_after) for t in topics}

    def refuse(self) -> None:
        if self.polls == 1:
            for broker in self.refusing:
                self.error_cb(KafkaError(KafkaError._AUTHENTICATION, f"{broker}: SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"))

    def list_topics(self, topic: str, timeout: float) -> Any:
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: SimpleNamespace(leader=1)})})


def test_a_refused_login_ends_the_start_once_it_stands_naming_the_user(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    monkeypatch.setattr(RefusingAdmin, "clock", clock)
    monkeypatch.setattr(client_module, "AdminClient", RefusingAdmin)
    security = KafkaSecurity(ssl_ca=None, sasl_username="agent-a", sasl_password="wrong-password")
    client = WritClient(brokers="127.0.0.1:1", agent_id="agent-a", reply_topic="writ.replies.agent-a", kafka_security=security)
    with pytest.raises(KafkaException) as err:
        client.start()
    client.close()
    assert err.value.args[0].code() == KafkaError._AUTHENTICATION, err.value
    assert "could not authenticate to the Kafka brokers as agent-a (SCRAM-SHA-512)" in str(err.value) and "invalid credentials" in str(err.value)
    # ended by the refusal itself, not by the create-topics request's timeout (15 s on a real broker)
    assert isinstance(err.value.__cause__, KafkaException) and err.value.__cause__.args[0].code() == KafkaError._AUTHENTICATION, err.value.__cause__
    assert "wrong-password" not in str(err.value)


def _reply_topic_ensured(monkeypatch: pytest.MonkeyPatch, clock: Clock, brokers: str) -> int:
    """The start's reply topic step (``_ensure_reply_topic``) over a RefusingOnceAdmin: its partition count."""
    monkeypatch.setattr(RefusingOnceAdmin, "clock", clock)
    security = KafkaSecurity(ssl_ca=None, sasl_username="agent-a", sasl_password="a-password")
    client = WritClient(brokers=brokers, agent_id="agent-a", reply_topic="writ.replies.agent-a", kafka_security=security)
    client._admin = RefusingOnceAdmin(client._conf())
    try:
        return client._ensure_reply_topic()
    finally:
        client.close()


def test_a_refusal_that_passes_lets_the_start_go_on(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    """A SCRAM user created a moment ago, not yet known to the broker: refused once, then logged in."""
    monkeypatch.setattr(RefusingOnceAdmin, "done_after", 5)
    assert _reply_topic_ensured(monkeypatch, clock, "127.0.0.1:1") == 1


def test_one_refusing_broker_among_others_lets_the_start_go_on(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    """One misconfigured broker of two: its refusal stands past the grace, the request goes through the other."""
    monkeypatch.setattr(RefusingOnceAdmin, "refusing", ("sasl_ssl://127.0.0.2:9093/bootstrap",))
    assert _reply_topic_ensured(monkeypatch, clock, "127.0.0.1:9093,127.0.0.2:9093") == 1
    assert clock.now - 1000.0 > client_module._REFUSAL_GRACE_S  # the refusal stood past the grace, and did not end it


@pytest.mark.parametrize(
    ("refused", "bootstrap", "after", "final"),
    [
        ({"127.0.0.1:1": 0.0}, "127.0.0.1:1", 0.5, False),  # a moment ago: it may pass
        ({"127.0.0.1:1": 0.0}, "127.0.0.1:1", 2.0, True),
        ({"b1:9092": 0.0}, "SASL_SSL://B1", 3.0, True),  # protocol, case and the default port as librdkafka names it
        ({"b1:9092": 0.0}, "b1:9092,b2:9092", 60.0, False),  # one broker of two
        ({"b1:9092": 0.0, "b2:9092": 1.5}, "b1:9092, b2:9092", 3.0, False),  # the last refusal is new
        ({"b1:9092": 0.0, "b2:9092": 1.5}, "b1:9092, b2:9092", 3.5, True),
        ({"b3:9092": 0.0}, "b1:9092", 60.0, False),  # a broker learned from metadata, not a bootstrap one
    ],
)
def test_when_refusals_end_the_start(refused: dict[str, float], bootstrap: str, after: float, final: bool) -> None:
    assert client_module._refused_for_good(refused, bootstrap, after) is final


def test_the_broker_of_a_refusal() -> None:
    named = client_module._ERROR_BROKER.match(REFUSED)
    assert named is not None and client_module._broker_address(named.group(1)) == "127.0.0.1:1"
    named = client_module._ERROR_BROKER.match("ssl://Kafka-1.example:9093/2: SSL handshake failed")
    assert named is not None and client_module._broker_address(named.group(1)) == "kafka-1.example:9093"
