"""A registry that refuses the client's schemas (docs/operations.md §6.7): owners never register the subjects only
clients write (``<intents topic>-value``, ``<intents topic>-Resolution``), so a level there that refuses writ's schema
(FORWARD or FULL on an upgrade, an older client on a subject a newer one made) is met by clients alone. The client
writes plain JSON then, which owners read like framed values, and warns once per subject, as TypeScript's does;
before, the registry's 409 was raised, and neither ``submit`` nor ``resolve`` could send anything.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from writ_client import AppliedReply, resolution_subject
from writ_client.devstack import ChildProcess, RecordsAdmin, Stack, start_owner

from .conftest import REPO, RUN, _delete_topics, make_client, topics_of
from .test_escalations import escalate, escalation_of

# A schema writ's is incompatible with: the subjects' only version, at FULL.
CLOSED = {"type": "object", "properties": {"other": {"type": "string"}}, "required": ["other"], "additionalProperties": False}


def _ccompat(stack: Stack, method: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(
        f"{stack.registry_url}{path}",
        data=None if body is None else json.dumps(body).encode("utf-8"),
        method=method,
        headers={"content-type": "application/vnd.schemaregistry.v1+json"},
    )
    with urllib.request.urlopen(req, timeout=10) as res:
        return json.loads(res.read() or b"null")


@pytest.fixture(scope="module")
def refused_topics() -> dict[str, str]:
    return topics_of(f"{RUN}-refused")


@pytest.fixture(scope="module")
def refusing_subjects(stack: Stack, refused_topics: dict[str, str]) -> Iterator[list[str]]:
    if not stack.registry_url:
        pytest.skip("no schema registry")
    subjects = [f"{refused_topics['intents']}-value", resolution_subject(refused_topics["intents"])]
    for subject in subjects:
        _ccompat(stack, "POST", f"/subjects/{subject}/versions", {"schemaType": "JSON", "schema": json.dumps(CLOSED)})
        _ccompat(stack, "PUT", f"/config/{subject}", {"compatibility": "FULL"})
    yield subjects
    for subject in subjects:
        for path in (f"/subjects/{subject}", f"/subjects/{subject}?permanent=true"):
            try:
                _ccompat(stack, "DELETE", path)
            except OSError:
                pass


@pytest.fixture(scope="module")
def refused_owner(stack: Stack, records_server: ChildProcess, refused_topics: dict[str, str], refusing_subjects: list[str]) -> Iterator[ChildProcess]:
    child = start_owner(
        REPO, stack, records_url=records_server.info["url"], topics=refused_topics, group_id=f"writ.owners.py-{RUN}-refused", intent_partitions=1
    )
    yield child
    child.stop()
    _delete_topics(stack, list(refused_topics.values()))


def test_intents_and_resolutions_go_as_plain_json_when_the_registry_refuses_their_schema(
    stack: Stack, refused_owner: ChildProcess, refused_topics: dict[str, str], refusing_subjects: list[str], records: RecordsAdmin, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="writ_client")
    agent = make_client(stack, refused_topics, "py-refused-agent")
    operator = make_client(stack, refused_topics, "py-refused-ops")
    try:
        # Three intents, each answered `conflict`, then escalated: sent, though their subject refuses the schema.
        escalated, _ = escalate(agent, records, f"T-refused-{uid}")
        e = escalation_of(operator, refused_topics, escalated)
        done = operator.resolve(e, "apply", base_version=records.read("ticket", e.entity.id)["version"], timeout=30)
        assert isinstance(done, AppliedReply) and done.resolved_by == "py-refused-ops", done
        assert records.patch_requests(e.intent_key) == 1
    finally:
        agent.close()
        operator.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "refused the schema" in r.getMessage()]
    # One warning per subject, whatever the number of values, naming the registry's answer.
    assert len(warned) == 2, warned
    for subject in refusing_subjects:
        assert sum(f"schema of {subject};" in w for w in warned) == 1, warned
    assert all("409" in w for w in warned), warned
    # Nothing was registered: the subjects hold the schema they refused writ's for.
    for subject in refusing_subjects:
        assert _ccompat(stack, "GET", f"/subjects/{subject}/versions") == [1]
