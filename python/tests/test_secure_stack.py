"""The Python client over SASL_SSL against the secure local stack (``src/testing/secure-stack.ts``).

One Kafka node whose clients connect over SASL_SSL (SCRAM-SHA-512, TLS from a CA
made at start) with ACLs enforced by the broker, and the Apicurio registry over
HTTPS with basic auth, started here with ``node scripts/kafka-up.ts --secure``
in a dir and on ports of its own (``.cache/run-secure-py``, 22892-22894 and
22881), beside the plain stack the other tests share; stopped at the end when
this module started it, or only its registry when it started just that again
(``WRIT_KEEP_STACK=1`` keeps it). When ``WRIT_SECURE_STACK_DIR`` (with
``WRIT_SECURE_KAFKA_PORT`` and ``WRIT_SECURE_REGISTRY_PORT``) names a stack, as
in CI, where the TypeScript suites' stack is kept for this one, that stack is
used. The module is its own
tenant of the stack (TENANT: SCRAM users, topics, groups and ACLs of its own,
``test/helpers/secure-tenants.ts``), so nothing of another suite's is in its
way. An owner (the tenant's ``writ-owner``) runs with an agent registry; the
Python client is the tenant's agent-a, configured from the same environment
variables as the TypeScript CLI (``WritClient.from_env``), signing its intents.

Skipped with ``WRIT_SKIP_SECURE=1``, or when Java or openssl is missing.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from writ_client import AppliedReply, Ed25519Signer, KafkaSecurity, RejectedReply, SubmitResult, WritClient
from writ_client.devstack import ChildProcess, RecordsAdmin, SecureStack, Stack, ensure_secure_stack, start_owner, stop_secure_stack

from .conftest import REPO
from .test_client import refund_input, seed_payment

KAFKA_PORT = 22892
REGISTRY_PORT = 22881
#: This module's tenant of the secure stack (test/helpers/secure-tenants.ts names it for the shared stack).
TENANT = "py-secure"
SIGNER = Ed25519Signer.generate(key_id="agent-a-py-1")

pytestmark = pytest.mark.skipif(
    os.environ.get("WRIT_SKIP_SECURE") == "1" or shutil.which("java") is None or shutil.which("openssl") is None,
    reason="the secure stack needs Java and openssl (or WRIT_SKIP_SECURE=1 is set)",
)


@pytest.fixture(scope="module")
def secure() -> Iterator[SecureStack]:
    t0 = time.monotonic()
    shared = os.environ.get("WRIT_SECURE_STACK_DIR", "")
    if shared:
        # the shared stack's dir and ports, as scripts/test.mjs and src/testing/secure-stack.ts take them
        layout = {"dir": shared, "kafka_port": int(os.environ.get("WRIT_SECURE_KAFKA_PORT") or 19492), "registry_port": int(os.environ.get("WRIT_SECURE_REGISTRY_PORT") or 18481)}
    else:
        layout = {"dir": REPO / ".cache" / "run-secure-py", "kafka_port": KAFKA_PORT, "registry_port": REGISTRY_PORT}
    s = ensure_secure_stack(REPO, tenant=TENANT, **layout)
    print(f"[secure-stack] {'started' if s.started else 'reused, its registry started again' if s.registry_restarted else 'reused'} in {time.monotonic() - t0:.1f} s")
    yield s
    if not os.environ.get("WRIT_KEEP_STACK"):
        stop_secure_stack(REPO, s)  # what this module started: nothing of a stack it reused as it was


@pytest.fixture(scope="module")
def secure_owner(secure: SecureStack, records_server: ChildProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChildProcess]:
    registry = tmp_path_factory.mktemp("secure-agents") / "agents.json"
    registry.write_text(
        json.dumps(
            {
                "agents": {
                    secure.users["agent-a"]: {
                        "keys": [{"id": SIGNER.key_id, "publicKey": SIGNER.public_key_pem()}],
                        "tools": ["refund_payment"],
                        "replyTopic": secure.reply_topic("agent-a"),
                    }
                }
            }
        )
    )
    child = start_owner(
        REPO,
        Stack(secure.brokers, secure.registry_url),
        records_url=records_server.info["url"],
        # The ACLs of the secure stack are for the tenant's names.
        topics=secure.topics,
        group_id=secure.group_id,
        intent_partitions=2,
        env={**secure.owner_env, "WRIT_AGENT_REGISTRY": str(registry), "WRIT_INSTANCE_ID": f"py-secure-owner-{uuid.uuid4().hex[:6]}"},
        timeout=180,
    )
    yield child
    child.stop()


def _registry_password(secure: SecureStack) -> str:
    with open(secure.owner_env["SCHEMA_REGISTRY_PASSWORD_FILE"], encoding="utf-8") as f:
        return f.read().strip()


def _agent_a(secure: SecureStack, **kw: Any) -> WritClient:
    """The tenant's agent-a, from the environment an agent of the stack gets."""
    agent = secure.users["agent-a"]
    return WritClient.from_env(agent_id=agent, reply_topic=secure.reply_topic("agent-a"), env=secure.env(agent), **kw)


class _Kept(logging.Handler):
    """Keeps every record's text (with its exception) for a secrets check."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(self.format(record))


@pytest.fixture(scope="module")
def unsigned_refusal(secure: SecureStack, secure_owner: ChildProcess, records: RecordsAdmin) -> Iterator[tuple[str, concurrent.futures.Future[SubmitResult], _Kept]]:
    """agent-a's intent, with agent-a's credentials and no signature, sent in a thread as the module's first test starts.

    The owner refuses it before its signature holds, and such an answer ends a submit only at its deadline (it may
    answer a forged record naming this intent id): in a thread, that wait runs beside the tests after the first
    rather than before them. Everything logged while it runs, by anyone, at DEBUG (this client's librdkafka lines
    too, through ``logger``), is kept for the secrets check."""
    kept = _Kept()
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.DEBUG)
    root.addHandler(kept)
    pid = f"pay_sec_uns_{uuid.uuid4().hex[:8]}"
    seeded = seed_payment(records, pid)

    def submit() -> SubmitResult:
        with _agent_a(secure, kafka_config={"logger": logging.getLogger("writ.test.unsigned-librdkafka")}) as unsigned:
            return unsigned.submit(refund_input(pid, seeded["version"], step="other-step"), timeout=15)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            yield pid, pool.submit(submit), kept
    finally:
        root.removeHandler(kept)
        root.setLevel(level)


def _secrets(secure: SecureStack) -> list[str]:
    return [secure.password(u) for u in secure.password_files] + [_registry_password(secure)]


def test_agent_a_from_the_environment_submits_signed_over_sasl_ssl(
    secure: SecureStack,
    secure_owner: ChildProcess,
    records: RecordsAdmin,
    unsigned_refusal: tuple[str, concurrent.futures.Future[SubmitResult], _Kept],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    client = _agent_a(secure, signer=SIGNER)
    assert client.kafka_security is not None and client.kafka_security.security_protocol == "SASL_SSL"
    assert client.producer_config()["sasl.mechanism"] == "SCRAM-SHA-512"
    assert client.producer_config()["ssl.ca.location"] == secure.ca_file
    assert client.schema_registry_url is not None and client.schema_registry_url.startswith("https://")
    assert client.codec.framed
    pid = f"pay_sec_{uuid.uuid4().hex[:8]}"
    seeded = seed_payment(records, pid)
    with client:
        reply = client.submit(refund_input(pid, seeded["version"]), timeout=60)
        assert isinstance(reply, AppliedReply), reply
        assert records.patch_requests(reply.intent_key) == 1
    # the same without its signature: unsigned_refusal, started with this test, answered in the last one
    secrets = _secrets(secure)
    out, err = capfd.readouterr()
    for text in (caplog.text, out, err, repr(client.kafka_security), repr(client.schema_registry_auth)):
        for secret in secrets:
            assert secret not in text


def test_a_wrong_password_fails_at_start_without_showing_it(secure: SecureStack, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = f"wrong-{uuid.uuid4()}"
    agent = secure.users["agent-a"]
    security = KafkaSecurity(ssl_ca=secure.ca_file, sasl_username=agent, sasl_password=wrong)
    client = WritClient(
        brokers=secure.brokers, agent_id=agent, reply_topic=secure.reply_topic("agent-a"), reply_topic_prefix=secure.reply_prefix, kafka_security=security
    )
    with pytest.raises(KafkaException) as err:
        client.start()
    client.close()
    text = str(err.value)
    assert err.value.args[0].code() == KafkaError._AUTHENTICATION, text
    # ended by the broker's refusal itself (error_cb), not by the reply topic request's 15 s timeout
    cause = err.value.__cause__
    assert isinstance(cause, KafkaException) and cause.args[0].code() == KafkaError._AUTHENTICATION, cause
    assert f"could not authenticate to the Kafka brokers as {agent} (SCRAM-SHA-512)" in text and "invalid credentials" in text, text
    out, errout = capfd.readouterr()
    # the stack's secrets too: the unsigned refusal's client may log meanwhile
    for t in (text, caplog.text, out, errout, repr(security)):
        for secret in [wrong, *_secrets(secure)]:
            assert secret not in t


def test_the_broker_refuses_agent_b_another_agents_reply_topic(secure: SecureStack) -> None:
    """The ACLs: agent-b may create and read only reply topics prefixed with the reply prefix and its own name."""
    agent_b = secure.users["agent-b"]
    client = WritClient.from_env(agent_id=agent_b, reply_topic=secure.reply_topic("agent-a"), env=secure.env(agent_b))
    with pytest.raises(KafkaException) as err:
        client.start()
    client.close()
    assert err.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err.value
    assert f"not authorized to create the reply topic {secure.reply_topic('agent-a')}" in str(err.value)


def test_the_registry_holds_the_schema_the_python_client_registered(secure: SecureStack, secure_owner: ChildProcess) -> None:
    """Over HTTPS with basic auth: the intents topic's value subject is there (registered by this client or the owner: one
    schema, the same text)."""
    from writ_client import RegistryAuth, RegistryTls, WireCodec

    codec = WireCodec(
        secure.registry_url,
        auth=RegistryAuth(secure.owner_env["SCHEMA_REGISTRY_USERNAME"], _registry_password(secure)),
        tls=RegistryTls(ca=secure.owner_env["SCHEMA_REGISTRY_CA_FILE"]),
    )
    intents = secure.topics["intents"]
    status, subjects = codec._http("GET", f"{codec.registry_url}/subjects", None)
    assert status == 200 and f"{intents}-value" in subjects, subjects
    # registering the same text again returns the id it has: the Python and TypeScript texts are one schema
    assert isinstance(codec.schema_id(intents, "WriteIntent"), int)
    status, versions = codec._http("GET", f"{codec.registry_url}/subjects/{intents}-value/versions", None)
    assert status == 200 and len(versions) == 1, versions


def test_agent_as_intent_without_its_signature_is_refused_unauthenticated(
    secure: SecureStack, records: RecordsAdmin, unsigned_refusal: tuple[str, concurrent.futures.Future[SubmitResult], _Kept]
) -> None:
    """Last: the answer to unsigned_refusal's intent, sent as the first test started (its deadline is 15 s)."""
    pid, answer, kept = unsigned_refusal
    refused = answer.result(timeout=120)
    assert isinstance(refused, RejectedReply) and refused.reason == "unauthenticated", refused
    assert records.patch_requests(refused.intent_key) == 0
    assert records.read("payment", pid)["state"]["refunds"] == []
    # what was logged while it ran, its librdkafka lines and writ_client's at DEBUG among them, holds no secret
    for text in kept.texts:
        for secret in _secrets(secure):
            assert secret not in text

