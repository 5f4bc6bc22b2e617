"""What the Python tests and examples run writ against, from a checkout of the writ repository.

Not for production. Needs the checkout's ``node_modules`` (``npm install``):

* :func:`ensure_stack`: the broker and registry named by ``KAFKA_BROKERS`` /
  ``SCHEMA_REGISTRY_URL``, else the local stack of ``node scripts/kafka-up.ts``
  (idempotent: it reuses a running one, and leaves it running);
* :func:`ensure_secure_stack`: the secure local stack of ``node scripts/kafka-up.ts
  --secure`` (SASL_SSL with SCRAM users and ACLs, an HTTPS registry with basic
  auth) in a dir and on ports of the caller's choice; :func:`stop_secure_stack`;
* :func:`start_records_server`: the demo records server as a child process
  (``RECORDS_HONOUR_IDEMPOTENCY_KEY=false``: only writ can stop a duplicate);
* :func:`start_owner`: a writ owner process (``consumers/owner-main.ts``) with
  the demo tools, on topics of its own;
* :class:`RecordsAdmin`: the records server's admin API (seed, read, stats).

Child processes are stopped by their own pid (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ChildProcess",
    "RecordsAdmin",
    "SecureStack",
    "Stack",
    "ensure_secure_stack",
    "ensure_stack",
    "find_repo",
    "node_binary",
    "start_owner",
    "start_records_server",
    "stop_secure_stack",
    "stop_stack",
]

_OWNER_MAIN = Path("consumers") / "owner-main.ts"


def find_repo(start: str | os.PathLike[str] | None = None) -> Path:
    """The writ checkout: ``WRIT_REPO``, else the first folder up from ``start`` (default: the working dir) holding ``consumers/owner-main.ts``."""
    env = os.environ.get("WRIT_REPO")
    if env:
        return Path(env).resolve()
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / _OWNER_MAIN).is_file() and (folder / "package.json").is_file():
            return folder
    # Installed in editable mode from the checkout: look beside this file too.
    for folder in Path(__file__).resolve().parents:
        if (folder / _OWNER_MAIN).is_file():
            return folder
    raise FileNotFoundError("no writ checkout found (set WRIT_REPO, or run from inside the repository)")


def node_binary(repo: Path) -> str:
    """The Node of the checkout's ``node`` devDependency, else ``node`` on the PATH."""
    local = repo / "node_modules" / ".bin" / "node"
    if local.exists():
        return str(local)
    found = shutil.which("node")
    if not found:
        raise FileNotFoundError("node not found: run npm install in the writ checkout")
    return found


def records_server_main(repo: Path) -> Path:
    """The demo records server's entry point, wherever the checkout keeps it (``src/testing/`` or ``src/sor/``)."""
    for rel in ("src/testing/demo-records-server-main.ts", "src/sor/demo-records-server-main.ts"):
        if (repo / rel).is_file():
            return repo / rel
    found = sorted(repo.glob("src/**/demo-records-server-main.ts"))
    if not found:
        raise FileNotFoundError("demo-records-server-main.ts not found under src/")
    return found[0]


@dataclass(frozen=True)
class Stack:
    brokers: str
    #: Empty when there is no registry (plain JSON values).
    registry_url: str
    #: True when this call started the local stack (``stop_stack`` then stops it); False when it was running or named by the environment.
    started: bool = False
    #: True when this call found the broker running and only started its registry again (it had died):
    #: ``stop_stack(registry_only=True)`` then stops that registry alone, the broker being others'.
    registry_restarted: bool = False


def ensure_stack(repo: Path, *, timeout: float = 300) -> Stack:
    """``KAFKA_BROKERS`` (and ``SCHEMA_REGISTRY_URL``) when set; else ``node scripts/kafka-up.ts`` (starts or reuses the local stack)."""
    brokers = os.environ.get("KAFKA_BROKERS", "").strip()
    if brokers:
        return Stack(brokers, os.environ.get("SCHEMA_REGISTRY_URL", "").strip())
    out = subprocess.run(
        [node_binary(repo), "scripts/kafka-up.ts"], cwd=repo, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if out.returncode != 0:
        raise RuntimeError(f"scripts/kafka-up.ts failed ({out.returncode}):\n{out.stderr[-3000:]}")
    env = dict(re.findall(r"^(KAFKA_BROKERS|SCHEMA_REGISTRY_URL)=(.*)$", out.stdout, flags=re.M))
    if not env.get("KAFKA_BROKERS"):
        raise RuntimeError(f"scripts/kafka-up.ts printed no KAFKA_BROKERS:\n{out.stdout[-2000:]}")
    started = re.search(r"\[local-stack\] started in", out.stderr) is not None
    registry_restarted = re.search(r"\[local-stack\] registry restarted in", out.stderr) is not None
    return Stack(env["KAFKA_BROKERS"].strip(), env.get("SCHEMA_REGISTRY_URL", "").strip(), started, registry_restarted)


def stop_stack(repo: Path, *, timeout: float = 120, registry_only: bool = False) -> None:
    """``node scripts/kafka-down.ts``: stops the local stack (through its pid files). Call it only for a stack you started.

    ``registry_only``: the registry alone (``Stack.registry_restarted``: the broker was running, and is others')."""
    args = [node_binary(repo), "scripts/kafka-down.ts", *(["--registry-only"] if registry_only else [])]
    subprocess.run(args, cwd=repo, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)


@dataclass(frozen=True)
class SecureStack:
    """The secure local stack (``src/testing/secure-stack.ts``): SASL_SSL (SCRAM-SHA-512, a CA made at start), ACLs, an HTTPS registry with basic auth."""

    brokers: str
    registry_url: str
    ca_file: str
    #: The owners' variables (SCRAM user ``writ-owner``): KAFKA_BROKERS, KAFKA_SSL_CA_FILE, KAFKA_SASL_*, SCHEMA_REGISTRY_*.
    owner_env: Mapping[str, str]
    #: User name → the file holding its password (``agent-a``, ``agent-b``, ``admin``, ``writ-owner``, or a tenant's).
    password_files: Mapping[str, str]
    #: True when this call started the stack (its broker): :func:`stop_secure_stack` then stops it all.
    started: bool = False
    #: True when this call found the broker running and only started its registry again (it had died):
    #: :func:`stop_secure_stack` then stops that registry alone, the broker being others'.
    registry_restarted: bool = False
    #: The variables that chose its dir and ports (for :func:`stop_secure_stack`).
    layout_env: Mapping[str, str] = field(default_factory=dict)
    #: Role (``agent-a``, ``agent-b``, ``admin``, ``writ-owner``) → user name: the role itself, or the tenant's user.
    users: Mapping[str, str] = field(default_factory=dict)

    def env(self, user: str) -> dict[str, str]:
        """The variables of a client acting as ``user`` (its password through ``KAFKA_SASL_PASSWORD_FILE``)."""
        return {**self.owner_env, "KAFKA_SASL_USERNAME": user, "KAFKA_SASL_PASSWORD_FILE": self.password_files[user]}

    def password(self, user: str) -> str:
        return Path(self.password_files[user]).read_text("utf-8").strip()

    @property
    def topics(self) -> dict[str, str]:
        """The owners' topics (``intents``, ``ledger``, ``human``, ``dlq``): a tenant's, or the defaults."""
        return {k: self.owner_env.get(f"WRIT_{k.upper()}_TOPIC", f"writ.{k}") for k in ("intents", "ledger", "human", "dlq")}

    @property
    def group_id(self) -> str:
        return self.owner_env.get("WRIT_GROUP_ID", "writ.owners")

    @property
    def reply_prefix(self) -> str:
        return self.owner_env.get("WRIT_REPLY_TOPIC_PREFIX", "writ.replies.")

    def reply_topic(self, agent: str) -> str:
        """The reply topic the ACLs give ``agent`` (a role: ``agent-a``, ``agent-b``): the reply prefix and its user name."""
        return self.reply_prefix + self.users[agent]


def _secure_layout(dir: str | os.PathLike[str], kafka_port: int, registry_port: int) -> dict[str, str]:
    return {"WRIT_SECURE_STACK_DIR": str(Path(dir).resolve()), "WRIT_SECURE_KAFKA_PORT": str(kafka_port), "WRIT_SECURE_REGISTRY_PORT": str(registry_port)}


def ensure_secure_stack(
    repo: Path, *, dir: str | os.PathLike[str], kafka_port: int, registry_port: int, tenant: str = "", timeout: float = 300
) -> SecureStack:
    """``node scripts/kafka-up.ts --secure`` in ``dir`` on ``kafka_port`` (and the two ports above it) and ``registry_port``.

    Starts the stack, or reuses the one of ours that serves there. Needs Java,
    openssl and the checkout's ``node_modules``. The passwords stay in files.
    ``tenant``: that tenant's users, topics and ACLs (``src/testing/secure-stack.ts``;
    made at start, and a running stack without it is an error).
    """
    layout = _secure_layout(dir, kafka_port, registry_port)
    out = subprocess.run(
        [node_binary(repo), "scripts/kafka-up.ts", "--secure", *(["--tenant", tenant] if tenant else [])],
        cwd=repo,
        env={**os.environ, **layout},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if out.returncode != 0:
        raise RuntimeError(f"scripts/kafka-up.ts --secure failed ({out.returncode}):\n{out.stderr[-3000:]}")
    owner_env = dict(re.findall(r"^([A-Z_]+)=(.*)$", out.stdout, flags=re.M))
    # "# agent agent-a: KAFKA_SASL_USERNAME=… KAFKA_SASL_PASSWORD_FILE=…", "# admin (…): KAFKA_SASL_USERNAME=…"
    lines = re.findall(r"^# (?:agent )?([a-z-]+)\b[^\n]*?KAFKA_SASL_USERNAME=(\S+) KAFKA_SASL_PASSWORD_FILE=(\S+)", out.stdout, flags=re.M)
    if not owner_env.get("KAFKA_BROKERS") or not owner_env.get("KAFKA_SSL_CA_FILE"):
        raise RuntimeError(f"scripts/kafka-up.ts --secure printed no KAFKA_BROKERS / KAFKA_SSL_CA_FILE:\n{out.stdout[-2000:]}")
    users = {role: user for role, user, _ in lines}
    files = {user: file for _, user, file in lines}
    users["writ-owner"] = owner_env["KAFKA_SASL_USERNAME"]
    files[owner_env["KAFKA_SASL_USERNAME"]] = owner_env["KAFKA_SASL_PASSWORD_FILE"]
    return SecureStack(
        brokers=owner_env["KAFKA_BROKERS"],
        registry_url=owner_env.get("SCHEMA_REGISTRY_URL", ""),
        ca_file=owner_env["KAFKA_SSL_CA_FILE"],
        owner_env=owner_env,
        password_files=files,
        started=re.search(r"^\[secure-stack\] started in", out.stderr, flags=re.M) is not None,
        registry_restarted=re.search(r"^\[secure-stack\] registry restarted in", out.stderr, flags=re.M) is not None,
        layout_env=layout,
        users=users,
    )


def stop_secure_stack(repo: Path, stack: SecureStack, *, timeout: float = 120) -> None:
    """Stops what :func:`ensure_secure_stack` started for ``stack``: the whole stack (``node scripts/kafka-down.ts
    --secure`` for its dir and ports) when it started it, its registry alone (``--registry-only``) when it only
    started that again for a broker that ran; nothing when it reused the stack as it was."""
    if not stack.started and not stack.registry_restarted:
        return
    subprocess.run(
        [node_binary(repo), "scripts/kafka-down.ts", "--secure", *([] if stack.started else ["--registry-only"])],
        cwd=repo,
        env={**os.environ, **stack.layout_env},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@dataclass
class ChildProcess:
    """A Node process started here; ``stop()`` ends it by its pid."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    info: dict[str, Any] = field(default_factory=dict)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text("utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 20) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _log_file(repo: Path, name: str) -> Path:
    folder = repo / ".writ"
    try:
        folder.mkdir(exist_ok=True)
    except OSError:
        folder = Path(tempfile.gettempdir())
    return folder / f"py-{name}-{os.getpid()}-{int(time.time() * 1000)}.log"


def _spawn(repo: Path, name: str, script: Path, env: Mapping[str, str]) -> ChildProcess:
    log_path = _log_file(repo, name)
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen([node_binary(repo), str(script)], cwd=repo, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        log.close()
    return ChildProcess(name, proc, log_path)


def start_records_server(repo: Path, *, timeout: float = 30) -> ChildProcess:
    """The demo records server on a free port (in-memory SQLite, its own Idempotency-Key dedupe off); ``info["url"]``."""
    child = _spawn(repo, "records", records_server_main(repo), {"RECORDS_PORT": "0", "RECORDS_DB": ":memory:", "RECORDS_HONOUR_IDEMPOTENCY_KEY": "false"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(r"demo records server listening on (http://[^\s\"]+)", child.log_tail(20000))
        if match:
            child.info["url"] = match.group(1)
            return child
        if not child.alive():
            break
        time.sleep(0.05)
    child.stop()
    raise RuntimeError(f"the demo records server did not start:\n{child.log_tail()}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_owner(
    repo: Path,
    stack: Stack,
    *,
    records_url: str,
    topics: Mapping[str, str],
    group_id: str,
    intent_partitions: int = 12,
    tools_module: str = "examples/demo-tools.ts",
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> ChildProcess:
    """A writ owner (``consumers/owner-main.ts``) on ``topics`` (``intents``, ``ledger``, ``human``, ``dlq``), ready once ``/readyz`` says every assigned partition runs."""
    health = _free_port()
    child = _spawn(
        repo,
        "owner",
        repo / _OWNER_MAIN,
        {
            "KAFKA_BROKERS": stack.brokers,
            "SCHEMA_REGISTRY_URL": stack.registry_url,
            "WRIT_TOOLS_MODULE": tools_module,
            "RECORDS_URL": records_url,
            "WRIT_INTENTS_TOPIC": topics["intents"],
            "WRIT_LEDGER_TOPIC": topics["ledger"],
            "WRIT_HUMAN_TOPIC": topics["human"],
            "WRIT_DLQ_TOPIC": topics["dlq"],
            "WRIT_GROUP_ID": group_id,
            "WRIT_INTENT_PARTITIONS": str(intent_partitions),
            "WRIT_HEALTH_PORT": str(health),
            "WRIT_INSTANCE_ID": f"py-owner-{os.getpid()}",
            # A short session: a group of one, rebalanced quickly when the process stops.
            "WRIT_SESSION_TIMEOUT_MS": "10000",
            **(env or {}),
        },
    )
    child.info["health"] = f"http://127.0.0.1:{health}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            break
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as res:
                body = json.loads(res.read())
                if res.status == 200 and body.get("ready") and len(body.get("detail") or []) >= 1:
                    return child
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.2)
    child.stop()
    raise RuntimeError(f"the writ owner did not become ready:\n{child.log_tail()}")


class RecordsAdmin:
    """The demo records server over HTTP: records, and its admin API (``/_admin/``)."""

    def __init__(self, url: str, *, timeout: float = 10) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Any, Mapping[str, str]]:
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as res:
                raw, status, headers = res.read(), res.status, dict(res.headers)
        except urllib.error.HTTPError as err:
            raw, status, headers = err.read(), err.code, dict(err.headers)
        return status, (json.loads(raw) if raw else None), {k.lower(): v for k, v in headers.items()}

    def seed(self, type_: str, id_: str, state: Any) -> dict[str, Any]:
        """Creates or replaces a record unconditionally; returns ``{"state", "version"}``."""
        status, body, headers = self._request("PUT", f"/_admin/records/{urllib.parse.quote(type_)}/{urllib.parse.quote(id_)}", state)
        if status >= 300:
            raise RuntimeError(f"seeding {type_}:{id_} answered {status}: {body}")
        return {"state": body, "version": headers.get("etag")}

    def read(self, type_: str, id_: str) -> dict[str, Any]:
        """A record as it is now: ``{"state", "version"}`` (the ETag)."""
        status, body, headers = self._request("GET", f"/records/{urllib.parse.quote(type_)}/{urllib.parse.quote(id_)}")
        if status != 200:
            raise RuntimeError(f"GET {type_}:{id_} answered {status}: {body}")
        return {"state": body, "version": headers.get("etag")}

    def stats(self) -> dict[str, Any]:
        """``records``, ``writes``, ``patchRequests``, ``patchRequestsByKey``, ``writesByKey``, ``putRequests``, ``putRequestsByKey``."""
        return self._request("GET", "/_admin/stats")[1]

    def patch_requests(self, intent_key: str) -> int:
        """PATCH requests that reached the server with this Idempotency-Key (the intent key)."""
        return int(self.stats().get("patchRequestsByKey", {}).get(intent_key, 0))

    def put_requests(self, intent_key: str) -> int:
        """PUT requests (creates) that reached the server with this Idempotency-Key (the intent key)."""
        return int(self.stats().get("putRequestsByKey", {}).get(intent_key, 0))
