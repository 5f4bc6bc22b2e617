"""WritClient's settings are checked when it is constructed, each error naming the field: no broker needed."""

from __future__ import annotations

from typing import Any

import pytest

from writ_client import EntityRef, IntentInput, KeyedTool, WritClient

from .test_submit_unit import FakeProducer, started_client

BASE: dict[str, Any] = {"brokers": "127.0.0.1:1", "agent_id": "a", "reply_topic": "writ.replies.a"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reply_topic", "writ.replies.a\n"),
        ("intents_topic", "writ.intents\n"),
        ("human_topic", "writ human"),
        ("reply_topic", ""),
        ("reply_topic", 5),
        ("submit_timeout", -5),
        ("submit_timeout", 0),
        ("submit_timeout", float("nan")),
        ("submit_timeout", float("inf")),
        ("submit_timeout", 1e300),
        ("submit_timeout", "30"),
        ("submit_timeout", True),
        ("reply_topic_partitions", 1.5),
        ("reply_topic_partitions", 0),
        ("reply_topic_partitions", "3"),
        ("replication_factor", 0),
        ("replication_factor", 2.0),
        ("agent_id", ""),
        ("agent_id", "x" * 129),
        ("agent_id", "\U0001f600" * 65),  # 130 UTF-16 code units
        ("agent_id", 123),
        ("client_id", ""),
        ("client_id", 7),
    ],
)
def test_a_bad_setting_is_refused_naming_its_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError) as err:
        WritClient(**{**BASE, field: value})
    assert field in str(err.value)


@pytest.mark.parametrize("value", ["big", 0, None])
def test_a_bad_message_max_bytes_is_refused_at_construction(value: Any) -> None:
    with pytest.raises(ValueError, match="message.max.bytes"):
        WritClient(**BASE, kafka_config={"message.max.bytes": value})


def test_message_max_bytes_bounds_an_intent_s_record() -> None:
    from confluent_kafka import KafkaError, KafkaException

    producer = FakeProducer()
    client = started_client(producer, kafka_config={"message.max.bytes": "2000"})
    intent = IntentInput(
        tool=KeyedTool(name="t", key_scope="run", intent_fields=()), entity=EntityRef(type="t", id="x"), run_id="r", step_id="s",
        base_version='"v"', delta=[{"op": "add", "path": "/a", "value": "x" * 3000}], params={},
    )
    with pytest.raises(KafkaException) as err:
        client.submit(intent, timeout=5)
    assert err.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE and producer.produced == []


def test_good_settings_are_kept() -> None:
    client = WritClient(**{**BASE, "agent_id": "x" * 128, "submit_timeout": 2, "reply_topic_partitions": 3, "client_id": "c"})
    assert client.submit_timeout == 2.0 and client.reply_topic_partitions == 3 and client.client_id == "c"
    assert WritClient(**{**BASE, "agent_id": "\U0001f600" * 64}).agent_id == "\U0001f600" * 64


@pytest.mark.parametrize("timeout", [-5, 0, float("nan"), float("inf"), "30"])
def test_a_bad_per_call_timeout_is_refused_before_anything_is_sent(timeout: Any) -> None:
    producer = FakeProducer()
    client = started_client(producer)
    intent = IntentInput(
        tool=KeyedTool(name="t", key_scope="run", intent_fields=()), entity=EntityRef(type="t", id="x"), run_id="r", step_id="s",
        base_version='"v"', delta=[{"op": "add", "path": "/a", "value": 1}], params={},
    )
    with pytest.raises(ValueError, match="timeout"):
        client.submit(intent, timeout=timeout)
    assert producer.produced == []


def test_from_env_takes_the_topics_owners_are_given_and_an_argument_wins() -> None:
    env = {"KAFKA_BROKERS": "127.0.0.1:1", "WRIT_INTENTS_TOPIC": "acme.intents", "WRIT_HUMAN_TOPIC": "acme.human", "WRIT_LEDGER_TOPIC": "acme.ledger"}
    c = WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env=env)
    assert (c.intents_topic, c.human_topic, c.ledger_topic) == ("acme.intents", "acme.human", "acme.ledger")
    c = WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env=env, human_topic="ops.human", ledger_topic="ops.ledger")
    assert (c.intents_topic, c.human_topic, c.ledger_topic) == ("acme.intents", "ops.human", "ops.ledger")
    c = WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env={"KAFKA_BROKERS": "127.0.0.1:1", "WRIT_HUMAN_TOPIC": " "})
    assert (c.intents_topic, c.human_topic, c.ledger_topic) == ("writ.intents", "writ.human", "writ.ledger")
    with pytest.raises(ValueError, match="human_topic"):
        WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env={**env, "WRIT_HUMAN_TOPIC": "acme human"})
    with pytest.raises(ValueError, match="ledger_topic"):
        WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env={**env, "WRIT_LEDGER_TOPIC": "acme ledger"})


@pytest.mark.parametrize("reply_topic", ["billing-agent.replies", "writ.replies.", "writ.repliesx"])
def test_a_reply_topic_owners_will_not_answer_on_is_refused_naming_the_prefix(reply_topic: str) -> None:
    # Owners dead-letter an intent whose replyTo lacks their WRIT_REPLY_TOPIC_PREFIX (reply_topic_not_allowed), with no
    # reply: every submit would end unknown. Refused here, as TypeScript's ClientConfig refuses it.
    with pytest.raises(ValueError) as err:
        WritClient(**{**BASE, "reply_topic": reply_topic})
    assert "reply_topic" in str(err.value) and "writ.replies." in str(err.value)


def test_the_reply_prefix_is_the_owners_and_from_env_reads_it() -> None:
    assert WritClient(**{**BASE, "reply_topic": "acme.replies.a", "reply_topic_prefix": "acme.replies."}).reply_topic == "acme.replies.a"
    env = {"KAFKA_BROKERS": "127.0.0.1:1", "WRIT_REPLY_TOPIC_PREFIX": "acme.replies."}
    assert WritClient.from_env(agent_id="a", reply_topic="acme.replies.a", env=env).reply_topic_prefix == "acme.replies."
    with pytest.raises(ValueError, match="reply_topic"):
        WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env=env)
    with pytest.raises(ValueError, match="reply_topic_prefix"):
        WritClient(**{**BASE, "reply_topic_prefix": "writ replies"})
