"""Session fixtures: a real broker and registry, the demo records server and one writ owner.

The broker and registry are ``KAFKA_BROKERS`` / ``SCHEMA_REGISTRY_URL`` when
set, else the local stack of ``node scripts/kafka-up.ts`` (reused when it
runs; stopped at the end only when this session started it, as the
TypeScript suite's global setup does). The records server and the owner are
child processes of this session, on topics of their own, stopped at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from writ_client import WritClient, WriteIntent
from writ_client.devstack import ChildProcess, RecordsAdmin, Stack, ensure_stack, find_repo, start_owner, start_records_server, stop_stack

REPO = find_repo(Path(__file__).resolve().parent)
RUN = uuid.uuid4().hex[:8]
INTENT_PARTITIONS = 12


def topics_of(run: str) -> dict[str, str]:
    return {k: f"writ.{k}.py-{run}" for k in ("intents", "ledger", "human", "dlq")}


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def vectors() -> dict[str, Any]:
    return json.loads((REPO / "test" / "fixtures" / "intent-key-vectors.json").read_text("utf-8"))


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    s = ensure_stack(REPO)
    yield s
    if (s.started or s.registry_restarted) and not os.environ.get("WRIT_KEEP_STACK"):
        # Only what this session started: a registry started again beside a running broker is stopped alone.
        stop_stack(REPO, registry_only=not s.started)


@pytest.fixture(scope="session")
def records_server(stack: Stack) -> Iterator[ChildProcess]:
    child = start_records_server(REPO)
    yield child
    child.stop()


@pytest.fixture(scope="session")
def records(records_server: ChildProcess) -> RecordsAdmin:
    return RecordsAdmin(records_server.info["url"])


@pytest.fixture(scope="session")
def topics() -> dict[str, str]:
    return topics_of(RUN)


@pytest.fixture(scope="session")
def owner(stack: Stack, records_server: ChildProcess, topics: dict[str, str]) -> Iterator[ChildProcess]:
    child = start_owner(
        REPO, stack, records_url=records_server.info["url"], topics=topics, group_id=f"writ.owners.py-{RUN}", intent_partitions=INTENT_PARTITIONS
    )
    yield child
    child.stop()
    _delete_topics(stack, [*topics.values(), *_created_topics])


_created_topics: list[str] = []


def reply_topic(name: str) -> str:
    topic = f"writ.replies.{name}.py-{RUN}"
    _created_topics.append(topic)
    return topic


def _delete_topics(stack: Stack, names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    try:
        admin = AdminClient({"bootstrap.servers": stack.brokers})
        for f in admin.delete_topics(names, operation_timeout=10).values():
            try:
                f.result()
            except Exception:  # noqa: BLE001 - best effort: a topic that is already gone
                pass
    except Exception:  # noqa: BLE001
        pass


def owner_metric(owner: ChildProcess, name: str, **labels: str) -> float:
    """The sum of a counter over its series (those with ``labels``, when given), from the owner's ``/metrics`` (0 when it
    has no sample yet)."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"{owner.info['health']}/metrics", timeout=10) as res:
        text = res.read().decode("utf-8")
    series = re.findall(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, flags=re.M)
    return sum(float(v) for found, v in series if all(f'{k}="{want}"' in found for k, want in labels.items()))


def make_client(stack: Stack, topics: dict[str, str], agent: str, *, framed: bool = True, **kw: Any) -> WritClient:
    return WritClient(
        brokers=stack.brokers,
        agent_id=agent,
        reply_topic=reply_topic(agent),
        intents_topic=topics["intents"],
        human_topic=topics["human"],
        ledger_topic=topics["ledger"],
        # Replies from an owner with a registry are framed: the plain client still decodes them, it only produces plain JSON.
        schema_registry_url=stack.registry_url or None,
        frame_values=framed and bool(stack.registry_url),
        **kw,
    ).start()


@pytest.fixture(scope="session")
def client(stack: Stack, topics: dict[str, str], owner: ChildProcess) -> Iterator[WritClient]:
    """Framed values (the registry's Confluent wire format)."""
    if not stack.registry_url:
        pytest.skip("no schema registry")
    c = make_client(stack, topics, "py-agent")
    yield c
    c.close()


@pytest.fixture(scope="session")
def plain_client(stack: Stack, topics: dict[str, str], owner: ChildProcess) -> Iterator[WritClient]:
    """Plain JSON intents."""
    c = make_client(stack, topics, "py-plain-agent", framed=False)
    yield c
    c.close()


@pytest.fixture
def uid() -> str:
    return uuid.uuid4().hex[:8]


def closed_while_waiting(client: WritClient, intent: WriteIntent) -> Any:
    """What ``client.submit(intent)``, its deadline an hour off and no reply coming, returns (or raises) when
    ``client`` is closed while it waits; fails when the submit still waits a minute after close()."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = client.submit(intent, timeout=3600)
        except Exception as err:  # noqa: BLE001 - what the caller looks at
            outcome["error"] = err

    # A daemon: one that waits out its hour must not hold pytest's exit.
    waiting = threading.Thread(target=run, daemon=True)
    waiting.start()
    deadline = time.monotonic() + 30
    while intent.intent_id not in client._waiting:
        assert time.monotonic() < deadline, "the submission never waited"
        time.sleep(0.01)
    client.close()
    waiting.join(60)
    assert not waiting.is_alive(), "the submit still waits for a reply after close()"
    assert "error" not in outcome, repr(outcome.get("error"))
    return outcome["result"]


def run_example_against(stack: Stack, records_server: ChildProcess, topics: dict[str, str], module: str) -> list[str]:
    """Runs an example module (``python -m``) against the session's stack, owner and records server; asserts it
    exits 0 with ``{"refunds_created":1}`` as its last line, and returns its lines."""
    env = {
        **os.environ,
        "KAFKA_BROKERS": stack.brokers,
        "SCHEMA_REGISTRY_URL": stack.registry_url,
        "RECORDS_URL": records_server.info["url"],
        "WRIT_INTENTS_TOPIC": topics["intents"],
    }
    env.pop("WRIT_EXAMPLE_START", None)
    out = subprocess.run([sys.executable, "-m", module], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == '{"refunds_created":1}', out.stdout
    return lines
