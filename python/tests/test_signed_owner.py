"""Signed intents against a writ owner that runs with an agent registry (``WRIT_AGENT_REGISTRY``).

The owner (TypeScript, a process) verifies the Python client's ``writ-signature``
header: a signed intent is applied and written once; an unsigned one, or one
signed by a key the registry does not list for the agent, is refused
``unauthenticated`` (dead-lettered, and answered on the agent's registered reply topic).
"""

from __future__ import annotations

import concurrent.futures
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from writ_client import AppliedReply, Ed25519Signer, RejectedReply, SubmitResult, WritClient
from writ_client.devstack import ChildProcess, RecordsAdmin, Stack, start_owner

from .conftest import REPO, RUN, _delete_topics, reply_topic, topics_of
from .test_client import refund_input, seed_payment
from .test_escalations import escalate

AGENT = "py-signed-agent"
SIGNER = Ed25519Signer.generate(key_id="py-2026-11")
# A second key for the same agent, listed in the registry as a PEM (the first one is there as raw base64).
ROTATED = Ed25519Signer.generate(key_id="py-2027-02")
OPERATOR = "py-signed-ops"
OPERATOR_SIGNER = Ed25519Signer.generate(key_id="ops-2026-12")


@pytest.fixture(scope="module")
def signed_topics() -> dict[str, str]:
    return topics_of(f"{RUN}-signed")


@pytest.fixture(scope="module")
def agent_reply_topic() -> str:
    return reply_topic(AGENT)


@pytest.fixture(scope="module")
def operator_reply_topic() -> str:
    return reply_topic(OPERATOR)


@pytest.fixture(scope="module")
def signed_owner(
    stack: Stack,
    records_server: ChildProcess,
    signed_topics: dict[str, str],
    agent_reply_topic: str,
    operator_reply_topic: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ChildProcess]:
    registry = tmp_path_factory.mktemp("agents") / "agents.json"
    registry.write_text(
        json.dumps(
            {
                "agents": {
                    AGENT: {
                        "keys": [
                            {"id": SIGNER.key_id, "publicKey": SIGNER.public_key_base64()},
                            {"id": ROTATED.key_id, "publicKey": ROTATED.public_key_pem()},
                        ],
                        "tools": ["refund_payment", "tag_ticket"],
                        "replyTopic": agent_reply_topic,
                    },
                    # An operator: allowed to resolve escalations, nothing else.
                    OPERATOR: {"keys": [{"id": OPERATOR_SIGNER.key_id, "publicKey": OPERATOR_SIGNER.public_key_base64()}], "tools": ["writ.resolve"], "replyTopic": operator_reply_topic},
                }
            }
        )
    )
    child = start_owner(
        REPO,
        stack,
        records_url=records_server.info["url"],
        topics=signed_topics,
        group_id=f"writ.owners.py-{RUN}-signed",
        intent_partitions=3,
        env={"WRIT_AGENT_REGISTRY": str(registry)},
    )
    yield child
    child.stop()
    _delete_topics(stack, [*signed_topics.values(), agent_reply_topic, operator_reply_topic])


def _client(stack: Stack, topics: dict[str, str], topic: str, *, agent: str = AGENT, **kw: Any) -> WritClient:
    return WritClient(
        brokers=stack.brokers,
        agent_id=agent,
        reply_topic=topic,
        intents_topic=topics["intents"],
        schema_registry_url=stack.registry_url or None,
        **kw,
    ).start()


@pytest.fixture(scope="module")
def signed_client(stack: Stack, signed_topics: dict[str, str], agent_reply_topic: str, signed_owner: ChildProcess) -> Iterator[WritClient]:
    c = _client(stack, signed_topics, agent_reply_topic, signer=SIGNER)
    yield c
    c.close()


def test_a_signed_intent_is_applied_and_written_once(signed_client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid = f"pay_sig_{uid}"
    seeded = seed_payment(records, pid)
    reply = signed_client.submit(refund_input(pid, seeded["version"]), timeout=30)
    assert isinstance(reply, AppliedReply), reply
    assert reply.duplicate is False
    assert records.patch_requests(reply.intent_key) == 1
    # the same intent again (new intent id, new signature): answered from the ledger
    again = signed_client.submit(refund_input(pid, seeded["version"], note="reworded"), timeout=30)
    assert isinstance(again, AppliedReply) and again.duplicate is True
    assert records.patch_requests(reply.intent_key) == 1


def test_the_rotated_key_in_pem_form_verifies_too(
    stack: Stack, signed_topics: dict[str, str], agent_reply_topic: str, signed_owner: ChildProcess, records: RecordsAdmin, uid: str
) -> None:
    pid = f"pay_rot_{uid}"
    seeded = seed_payment(records, pid)
    with _client(stack, signed_topics, agent_reply_topic, signer=ROTATED, frame_values=False) as c:
        reply = c.submit(refund_input(pid, seeded["version"]), timeout=30)
    assert isinstance(reply, AppliedReply), reply


# Signers the registry does not list for the agent: the owner refuses what they sign `unauthenticated`.
NOT_THE_AGENTS = {
    "unsigned": None,
    "unknown key id": Ed25519Signer.generate(key_id="not-registered"),
    "wrong key for the key id": Ed25519Signer.generate(key_id=SIGNER.key_id),
}


@dataclass(frozen=True)
class Refused:
    """A submission sent by :func:`refusals`: the record it names, and its answer to come."""

    entity_id: str
    answer: concurrent.futures.Future[SubmitResult]
    #: The intent key of the escalated intent an operator's resolution names (the operator's case only).
    escalated_key: str = ""


@pytest.fixture(scope="module")
def refusals(
    stack: Stack,
    signed_topics: dict[str, str],
    agent_reply_topic: str,
    operator_reply_topic: str,
    signed_client: WritClient,
    records: RecordsAdmin,
) -> Iterator[dict[str, Refused]]:
    """The submissions refused before their signature holds, each from a client of its own, sent at once.

    Such a refusal ends a call only at its deadline (it may answer a forged record naming this intent id), so the
    deadline is short (10 s), and each call waits all of it: sent together they wait 10 s, not 10 s each. Keyed by
    NOT_THE_AGENTS's cases, and ``operator`` for the unsigned resolution of an escalation."""
    run = uuid.uuid4().hex[:8]
    jobs: dict[str, tuple[str, Callable[[], SubmitResult], str]] = {}
    for n, (how, signer) in enumerate(NOT_THE_AGENTS.items()):
        pid = f"pay_uns_{n}_{run}"
        seeded = seed_payment(records, pid)

        def submit(signer: Ed25519Signer | None = signer, pid: str = pid, version: str = seeded["version"]) -> SubmitResult:
            with _client(stack, signed_topics, agent_reply_topic, signer=signer) as c:
                return c.submit(refund_input(pid, version), timeout=10)

        jobs[how] = (pid, submit, "")
    tid = f"T-sig-unsigned-{run}"
    escalated, _ = escalate(signed_client, records, tid)

    def resolve_unsigned() -> SubmitResult:
        with _client(stack, signed_topics, operator_reply_topic, agent=OPERATOR, signer=None) as ops:
            [found] = [r.escalation for r in ops.read_escalations(topic=signed_topics["human"]) if r.escalation.escalation_id == escalated.escalation_id]
            return ops.resolve(found, "apply", timeout=10)

    jobs["operator"] = (tid, resolve_unsigned, escalated.intent_key)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        yield {how: Refused(entity, pool.submit(job), key) for how, (entity, job, key) in jobs.items()}


@pytest.mark.parametrize("how", list(NOT_THE_AGENTS))
def test_an_intent_not_signed_by_the_agent_is_refused_unauthenticated(how: str, refusals: dict[str, Refused], records: RecordsAdmin) -> None:
    refused = refusals[how]
    reply = refused.answer.result(timeout=120)
    assert isinstance(reply, RejectedReply), reply
    assert reply.reason == "unauthenticated", reply
    assert records.read("payment", refused.entity_id)["state"]["refunds"] == []
    assert records.patch_requests(reply.intent_key) == 0


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_an_operators_resolution_is_carried_out_only_when_signed_by_the_operator(
    signed: bool, stack: Stack, signed_topics: dict[str, str], operator_reply_topic: str, signed_client: WritClient, records: RecordsAdmin, uid: str, request: pytest.FixtureRequest
) -> None:
    if signed:
        tid = f"T-sig-{signed}-{uid}"
        escalated, _ = escalate(signed_client, records, tid)
        with _client(stack, signed_topics, operator_reply_topic, agent=OPERATOR, signer=OPERATOR_SIGNER) as ops:
            [found] = [r.escalation for r in ops.read_escalations(topic=signed_topics["human"]) if r.escalation.escalation_id == escalated.escalation_id]
            answer = ops.resolve(found, "apply", timeout=30)
        escalated_key = escalated.intent_key
    else:
        # Unsigned: refused before the signature holds, so the answer ends the call only at its deadline (see refusals).
        refused: Refused = request.getfixturevalue("refusals")["operator"]
        tid, escalated_key = refused.entity_id, refused.escalated_key
        answer = refused.answer.result(timeout=120)
    assert isinstance(answer, (AppliedReply, RejectedReply)), answer
    if signed:
        assert isinstance(answer, AppliedReply) and answer.resolved_by == OPERATOR, answer
        assert records.patch_requests(escalated_key) == 1
    else:
        assert isinstance(answer, RejectedReply) and answer.reason == "unauthenticated", answer
        assert records.patch_requests(escalated_key) == 0
        assert records.read("ticket", tid)["state"]["tags"] == []


def test_the_owner_dead_lettered_the_refusals(signed_owner: ChildProcess) -> None:
    """Runs after the tests above: each refusal is logged with its reason; no reply went missing."""
    log = signed_owner.log_tail(10_000_000)
    assert "unauthenticated" in log
    assert '"reason":"reply_topic_missing"' not in log
