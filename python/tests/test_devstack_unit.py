"""ensure_secure_stack / stop_secure_stack with a fake ``node``: each stops only what kafka-up.ts said it started.

A reuse of a secure stack whose registry had died starts that registry alone (``registry restarted``); stopping
the whole stack then would stop a broker other suites use.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

import writ_client.devstack as devstack

OUT = "\n".join(
    [
        "# the owners (SCRAM user writ-owner); CA: /s/tls/ca.pem",
        "KAFKA_BROKERS=127.0.0.1:22892",
        "KAFKA_SSL_CA_FILE=/s/tls/ca.pem",
        "KAFKA_SASL_USERNAME=writ-owner",
        "KAFKA_SASL_PASSWORD_FILE=/s/secrets/writ-owner.password",
        "SCHEMA_REGISTRY_URL=https://127.0.0.1:22881/apis/ccompat/v7",
        "# agent agent-a: KAFKA_SASL_USERNAME=agent-a KAFKA_SASL_PASSWORD_FILE=/s/secrets/agent-a.password",
        "",
    ]
)
STARTED = "[secure-stack] started in 14.2 s; stop with: npm run kafka:down -- --secure\n"
REGISTRY = (
    "[secure-stack] the secure broker at 127.0.0.1:22892 serves, its registry does not; starting the registry again\n"
    "[secure-stack] registry restarted in 9.1 s (the broker was running); stop it alone with: npm run kafka:down -- --secure --registry-only\n"
)
RUNNING = "[secure-stack] already running in 0.4 s; stop with: npm run kafka:down -- --secure\n"


class FakeNode:
    """Runs nothing: records each command; kafka-up.ts answers with OUT on stdout and ``up_stderr``."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.up_stderr = ""

    def run(self, cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(cmd[1:])
        up = "scripts/kafka-up.ts" in cmd
        return subprocess.CompletedProcess(cmd, 0, OUT if up else "", self.up_stderr if up else "")


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> FakeNode:
    fake = FakeNode()
    monkeypatch.setattr(devstack, "node_binary", lambda repo: "node")
    monkeypatch.setattr(devstack.subprocess, "run", fake.run)
    return fake


def _up_then_down(node: FakeNode, stderr: str, tmp_path: Path) -> tuple[devstack.SecureStack, list[list[str]]]:
    node.up_stderr = stderr
    stack = devstack.ensure_secure_stack(tmp_path, dir=tmp_path / "s", kafka_port=22892, registry_port=22881)
    devstack.stop_secure_stack(tmp_path, stack)
    return stack, [c for c in node.calls if "scripts/kafka-down.ts" in c]


def test_a_stack_it_started_is_stopped_whole(node: FakeNode, tmp_path: Path) -> None:
    stack, downs = _up_then_down(node, STARTED, tmp_path)
    assert (stack.started, stack.registry_restarted) == (True, False)
    assert downs == [["scripts/kafka-down.ts", "--secure"]]


def test_a_registry_it_started_again_is_stopped_alone_the_broker_left_running(node: FakeNode, tmp_path: Path) -> None:
    stack, downs = _up_then_down(node, REGISTRY, tmp_path)
    assert (stack.started, stack.registry_restarted) == (False, True)
    assert downs == [["scripts/kafka-down.ts", "--secure", "--registry-only"]]


def test_a_stack_it_reused_as_it_was_is_left_running(node: FakeNode, tmp_path: Path) -> None:
    stack, downs = _up_then_down(node, RUNNING, tmp_path)
    assert (stack.started, stack.registry_restarted) == (False, False)
    assert downs == []


PLAIN_OUT = "KAFKA_BROKERS=127.0.0.1:19092\nSCHEMA_REGISTRY_URL=http://127.0.0.1:18081/apis/ccompat/v7\n"


@pytest.mark.parametrize(
    ("stderr", "started", "restarted", "down"),
    [
        ("[local-stack] started in 9.2 s; stop with: npm run kafka:down\n", True, False, [["scripts/kafka-down.ts"]]),
        (
            "[local-stack] registry restarted in 4.7 s (the broker was running); stop it alone with: npm run kafka:down -- --registry-only\n",
            False,
            True,
            [["scripts/kafka-down.ts", "--registry-only"]],
        ),
        ("[local-stack] already running in 0.1 s; stop with: npm run kafka:down\n", False, False, []),
    ],
)
def test_the_plain_stack_too_stops_only_what_it_started(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stderr: str, started: bool, restarted: bool, down: list[list[str]]
) -> None:
    monkeypatch.delenv("KAFKA_BROKERS", raising=False)
    node.up_stderr = stderr
    monkeypatch.setattr(
        node, "run", lambda cmd, **kw: (node.calls.append(cmd[1:]), subprocess.CompletedProcess(cmd, 0, PLAIN_OUT if "scripts/kafka-up.ts" in cmd else "", stderr))[1]
    )
    monkeypatch.setattr(devstack.subprocess, "run", node.run)
    stack = devstack.ensure_stack(tmp_path)
    assert (stack.started, stack.registry_restarted) == (started, restarted)
    # What the suite's session fixture does (conftest.py): stop only what this call started.
    if stack.started or stack.registry_restarted:
        devstack.stop_stack(tmp_path, registry_only=not stack.started)
    assert [c for c in node.calls if "scripts/kafka-down.ts" in c] == down
