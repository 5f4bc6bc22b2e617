"""start() with a fake AdminClient: a refused login ends the start at once, not at the reply topic request's timeout."""

from __future__ import annotations

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


class RefusingAdmin:
    """An AdminClient whose every poll serves error_cb the broker's refusal of the login."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.error_cb = conf["error_cb"]
        self.polls = 0

    def create_topics(self, topics: list[Any], request_timeout: float) -> dict[str, NeverAnswered]:
        return {t.topic: NeverAnswered() for t in topics}

    def poll(self, timeout: float) -> int:
        self.polls += 1
        self.error_cb(KafkaError(KafkaError._AUTHENTICATION, REFUSED))
        return 0


def test_a_refused_login_ends_the_start_at_once_naming_the_user(monkeypatch: pytest.MonkeyPatch) -> None:
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
