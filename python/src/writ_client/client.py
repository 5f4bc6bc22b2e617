"""The agent side of writ in Python: submit write intents, read replies.

Wire behaviour matches the TypeScript client (``producers/writ-client.ts``):

* intents are produced to ``writ.intents`` keyed by the entity key with the
  Java-compatible murmur2 partitioner (librdkafka ``murmur2_random``), from an
  idempotent producer with ``acks=all``; the client never re-sends at the writ
  layer (the owner's ledger answers a repeat of an intent key);
* values are plain JSON, or the Confluent wire format with a schema id of
  subject ``<topic>-value`` when a schema registry is configured;
* the agent's reply topic is created by the client if missing, read with
  ``isolation.level=read_committed`` from its read_committed end at start,
  skipping records that carry the ``writ-control`` header;
* at a submit's deadline the result is ``unknown``, or ``blocked`` when the
  reply partition's last stable offset stayed put for the whole wait behind
  its high watermark (an open transaction hides later replies);
* a rejection owners give before a record's signature is verified
  (``PROVISIONAL_REJECTIONS``) may answer a forged record naming this client's
  intent id: it ends a submit only at the deadline, if no other answer came;
* with a signer, every intent carries the ``writ-signature`` header (Ed25519
  over its canonical JSON), which owners with an agent registry require;
* an intent holding a value with no canonical JSON (a lone surrogate, NaN,
  ±Infinity) is refused before anything is sent (``CanonicalJsonError``,
  ``not_canonical``): owners would refuse it;
* SASL/TLS to the brokers and basic auth/TLS to the registry come from
  :mod:`writ_client.security` (explicit, or the environment variables of
  writ's TypeScript side: :meth:`WritClient.from_env`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import math
import os
import queue
import random
import re
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import Unpack

from .canonical import CanonicalJsonError, canonical_json, utf16_length
from .codec import DecodeError, RegistryError, WireCodec, json_depth
from .escalations import KIND_HEADER, Decision, EscalationRecord, build_resolution, latest_ledger_entries, read_escalations, resolution_bounds, resolution_subject
from .keys import KeyedTool, entity_key, intent_key, undo_intent_key
from .models import (
    ABSENT_VERSION,
    LEDGER_VERSION,
    AgentRef,
    AppliedReply,
    BlockedOutcome,
    RejectedReply,
    EntityRef,
    Escalation,
    JsonPatchOp,
    SubmitResult,
    UndoRef,
    UnknownOutcome,
    WriteIntent,
    iso_now,
    parse_reply,
)
from .partitioner import partition_for
from .security import ConnectionSecurity, KafkaSecurity, RegistryAuth, RegistryTls, transport_warnings
from .signing import SIGNATURE_HEADER, AudienceInvalid, IntentSigner, SigningError, check_audience, sign_intent

if TYPE_CHECKING:
    from .change import ChangeInput, ChangeResult

__all__ = ["CONTROL_HEADER", "IntentInput", "IntentSigner", "ReplyStream", "WritClient", "create_input"]

#: Records carrying this header are not values (e.g. an owner's ``heal`` record): every reader skips them.
CONTROL_HEADER = "writ-control"

#: How deep a reply may nest: owners put record state (nested up to 256 levels) into replies; other values get the codec's 64.
REPLY_MAX_DEPTH = 512

#: The most replies a replies() stream holds unread (TypeScript's MAX_UNREAD_REPLIES); past it the oldest are dropped.
MAX_UNREAD_REPLIES = 1024

#: How long the probe of the reply partitions' ends at a submit's deadline may take, for the whole batch.
_PROBE_TIMEOUT = 10.0

#: How long a refused login or TLS setup must stand, reported by every bootstrap broker, before start() gives up
#: without waiting for the reply topic request's 15 s timeout. librdkafka reports a broker's refusal once (an identical
#: one again only after 30 s) and logs in again meanwhile, so a refusal that passes (a SCRAM user created a moment
#: ago, not yet known to every broker) ends with the request done, and one misconfigured broker among others never
#: counts for all of them.
_REFUSAL_GRACE_S = 2.0
#: The broker an error_cb text names: ``sasl_ssl://host:port/bootstrap: …`` or ``…/<node id>: …``.
_ERROR_BROKER = re.compile(r"^(?:[A-Za-z_]+://)?([^/\s]+)/(?:bootstrap|-?\d+): ")


def _broker_address(name: str) -> str:
    """``host:port`` of a bootstrap entry or an error's broker, lower case, without its protocol (default port 9092)."""
    address = re.sub(r"^[A-Za-z_]+://", "", name.strip()).lower()
    return address if re.search(r":\d+$", address) else f"{address}:9092"


def _refused_for_good(refused_at: Mapping[str, float], bootstrap: str, now: float, grace: float = _REFUSAL_GRACE_S) -> bool:
    """Whether start() ends at the brokers' refusals (``refused_at``: address → when it first refused the login or TLS
    setup): every bootstrap broker refused, the last of them at least ``grace`` seconds ago, the request still pending."""
    wanted = {_broker_address(b) for b in bootstrap.split(",") if b.strip()}
    return bool(wanted) and wanted <= refused_at.keys() and now - max(refused_at[b] for b in wanted) >= grace


#: Rejections an owner with an agent registry answers before the record's signature is verified (or when it fails):
#: anyone who can produce to ``writ.intents`` can have one sent to this agent's reply topic for an intent id it knows.
#: Such a rejection does not end a submit at once: an answer from the signed intent itself wins until the deadline,
#: and only then is the rejection returned. The same set as the TypeScript client's.
PROVISIONAL_REJECTIONS: frozenset[str] = frozenset(
    {"unauthenticated", "schema_invalid", "schema_subject_mismatch", "undecodable", "key_missing", "key_mismatch", "not_canonical", "too_deep"}
)

#: ``details.problem`` of an ``unauthenticated`` refusal for the audience: owners give it only once the signature
#: verified, so it answers bytes this agent signed with this intent id (its own submission) and is final, not held.
_AUDIENCE_PROBLEMS = frozenset({"audience_missing", "audience_mismatch"})


def _provisional(reply: Reply) -> bool:
    """Whether ``reply`` is a rejection owners give before they authenticated the record (held to the deadline)."""
    if not isinstance(reply, RejectedReply) or reply.reason not in PROVISIONAL_REJECTIONS:
        return False
    details = reply.details
    return not (reply.reason == "unauthenticated" and isinstance(details, dict) and isinstance(details.get("problem"), str) and details["problem"] in _AUDIENCE_PROBLEMS)

#: librdkafka's default ``message.max.bytes``, and a bound on what a record adds to its key, value and headers.
_MESSAGE_MAX_BYTES = 1_000_000
_RECORD_OVERHEAD = 128

#: The owners' defaults for ``WRIT_MAX_INTENT_BYTES`` and ``WRIT_MAX_JSON_DEPTH`` (docs/wire-contract.md): an intent
#: larger or deeper is dead-lettered ``too_large`` / ``too_deep`` without a reply, so the client refuses it first.
DEFAULT_MAX_INTENT_BYTES = 262_144
DEFAULT_MAX_JSON_DEPTH = 32


class IntentRefused(ValueError):
    """An intent (or resolution) refused before anything was sent, for good: the same value is refused the same way.

    ``code``: ``too_large`` (its encoded value is over the owners' ``WRIT_MAX_INTENT_BYTES``) or ``too_deep``
    (nested deeper than their ``WRIT_MAX_JSON_DEPTH``). Owners dead-letter such a value without a reply, so sent it
    would only come back ``unknown``, every time (TypeScript's ``WritError`` of the same code).
    """

    def __init__(self, code: Literal["too_large", "too_deep"], message: str) -> None:
        super().__init__(message)
        self.code = code

_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_REPLY_PREFIX = re.compile(r"[a-zA-Z0-9._-]{1,248}")
_INTENT_KEY = re.compile(r"[0-9a-f]{64}")
_log = logging.getLogger("writ_client")

Reply = Any  # AppliedReply | ConflictReply | RejectedReply | EscalatedReply (see models.Reply)


class ClientClosed(RuntimeError):
    """This client was closed (TypeScript's ``client_closed``): a submit, resolve or change after :meth:`WritClient.close`
    is refused before anything is sent. Not worth retrying on this client: create a new one."""

    code: Literal["client_closed"] = "client_closed"
    retriable = False

    def __init__(self, message: str = "this client was closed; create a new one") -> None:
        super().__init__(message)


#: What a submit waiting for its reply when the client is closed is told (TypeScript's words).
_CLOSED_UNKNOWN = "This client was closed, so no reply can be read. The write may or may not have happened: submit the same intent key again with a new client to ask."


class _Sent(Protocol):
    """What was sent and is waited for: its answer carries ``intent_id``."""

    @property
    def intent_id(self) -> str: ...

    @property
    def intent_key(self) -> str: ...


@dataclass(frozen=True)
class _ResolutionSent:
    #: The resolution's id: the owner answers the operator under it.
    intent_id: str
    #: The escalated intent's key.
    intent_key: str


class IntentInput(BaseModel):
    """A write as a tool call describes it; the client adds the ids, the key and the reply topic."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    tool: KeyedTool
    entity: EntityRef
    run_id: str = Field(min_length=1)
    step_id: str = Field(min_length=1)
    #: Carried for correlation only, never part of the key.
    tool_call_id: str | None = None
    #: The ETag the harness read, never one the model wrote.
    base_version: str
    delta: list[JsonPatchOp]
    params: dict[str, Any]


def create_input(
    tool: KeyedTool,
    *,
    external_id: str,
    body: Any,
    params: Mapping[str, Any],
    run_id: str,
    step_id: str,
    tool_call_id: str | None = None,
    record_type: str | None = None,
) -> IntentInput:
    """The :class:`IntentInput` of a create (TypeScript's ``createIntentInput``): the record ``{record_type,
    external_id}``, base version ``"absent"`` and the delta ``[{"op": "add", "path": "", "value": body}]``.

    ``external_id`` and ``body`` must be what the owner's declaration makes of ``params`` (its
    ``create.externalId`` and ``create.body``): the owner rebuilds both and rejects a create that differs. The
    record type is ``record_type``, else the tool's. One create per external id: the owner creates it with
    ``If-None-Match: *``, a repeat is answered from the ledger, another agent's create of the same id is a
    conflict carrying the record.
    """
    kind = record_type or tool.record_type
    if not kind:
        raise ValueError(f"create_input: tool {tool.name} has no record_type; pass record_type=")
    return IntentInput(
        tool=tool,
        entity=EntityRef(type=kind, id=external_id),
        run_id=run_id,
        step_id=step_id,
        tool_call_id=tool_call_id,
        base_version=ABSENT_VERSION,
        delta=[{"op": "add", "path": "", "value": body}],
        params=dict(params),
    )


def backoff_until(round_: int, deadline: float) -> float:
    """Seconds to wait before asking again (a write answered ``leased``; a change's intents): 100 ms doubling to
    2 s, ±20 %, never past ``deadline`` (monotonic). As TypeScript's ``backoffUntil``."""
    # The exponent capped: 2**1024 has no float (a write answered `leased` for half an hour reaches it).
    base = min(2.0, 0.1 * (2 ** min(round_, 16)))
    return max(0.0, min(deadline - time.monotonic(), base * random.uniform(0.8, 1.2)))


class _UndoOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`WritClient.undo`."""

    timeout: float | None
    run_id: str
    step_id: str | None
    tool_call_id: str | None
    from_ledger: bool


class _ResolveOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`WritClient.resolve`."""

    base_version: str | None
    delta: Sequence[JsonPatchOp | Mapping[str, Any]] | None
    message: str | None
    timeout: float | None


#: How many submitted intents a client remembers (key → record and tool) for :meth:`WritClient.undo` by key alone.
_REMEMBERED = 10_000


@dataclass(frozen=True)
class _Ends:
    last_stable: int
    high_watermark: int


class WritClient:
    """Submits write intents for one agent and reads the owner's replies.

    Example::

        with WritClient(brokers="127.0.0.1:19092", agent_id="billing-agent",
                        reply_topic="writ.replies.billing-agent",
                        signer=Ed25519Signer.from_pem_file("agent.key.pem", key_id="2026-11")) as writ:
            reply = writ.submit(IntentInput(tool=refund, entity=EntityRef(type="payment", id="pay_1"),
                                            run_id=conversation_id, step_id="once-per-run", base_version='"v3"',
                                            delta=[{"op": "add", "path": "/refunds/-", "value": {"amountCents": 500}}],
                                            params={"amountCents": 500, "reason": "damaged"}), timeout=10)
    """

    def __init__(
        self,
        *,
        brokers: str | Sequence[str],
        agent_id: str,
        reply_topic: str,
        reply_topic_prefix: str = "writ.replies.",
        intents_topic: str = "writ.intents",
        human_topic: str = "writ.human",
        ledger_topic: str = "writ.ledger",
        schema_registry_url: str | None = None,
        client_id: str | None = None,
        reply_topic_partitions: int = 1,
        replication_factor: int = 1,
        submit_timeout: float = 30.0,
        signer: IntentSigner | None = None,
        audience: str | None = None,
        frame_values: bool | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        kafka_security: KafkaSecurity | None = None,
        schema_registry_auth: RegistryAuth | tuple[str, str] | None = None,
        schema_registry_tls: RegistryTls | None = None,
        max_intent_bytes: int = DEFAULT_MAX_INTENT_BYTES,
        max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
    ) -> None:
        """Configures the client; :meth:`start` (or ``with``) connects.

        Args:
            brokers: ``host:port`` list (or a comma-separated string).
            agent_id: this agent; part of every ``run``-scoped intent key.
            reply_topic: this agent's reply topic; must start with the owners' reply prefix (``writ.replies.``).
            reply_topic_prefix: the owners' ``WRIT_REPLY_TOPIC_PREFIX``: they answer only on topics that start with it
                and dead-letter every other intent ``reply_topic_not_allowed``, with no reply.
            intents_topic: the owners' intents topic.
            human_topic: the owners' escalations topic, which :meth:`read_escalations` reads.
            ledger_topic: the owners' ledger, which ``read_escalations(open_only=True)`` reads (an operator's
                client only; it needs read access to the ledger).
            schema_registry_url: a Confluent-API registry (e.g. Apicurio's ``/apis/ccompat/v7``): framed
                values; without it plain JSON (framed replies then cannot be read).
            reply_topic_partitions, replication_factor: for the reply topic when the client creates it.
            submit_timeout: default deadline of :meth:`submit`, seconds.
            signer: signs every intent (Ed25519, ``writ-signature`` header), e.g.
                :class:`~writ_client.signing.Ed25519Signer`; required where owners run with an agent registry.
            audience: the deployment this client signs for: its owners' ``WRIT_SIGNING_AUDIENCE`` (1–128 of
                ``A-Z a-z 0-9 . _ : / -``). Put in every intent and resolution it signs (lease and undo intents too),
                so owners of another deployment that lists the same key refuse them. Needs ``signer``
                (:class:`~writ_client.signing.AudienceInvalid` otherwise: an unsigned audience protects nothing).
            frame_values: produce framed (True) or plain JSON (False) values; default: framed with a registry.
            kafka_config: extra librdkafka settings for the admin client, producer and consumer
                (timeouts…); the producer's idempotence, ``acks=all`` and partitioner stay as they are.
            kafka_security: SASL and TLS to the brokers (:class:`~writ_client.security.KafkaSecurity`).
            schema_registry_auth: basic auth to the registry (:class:`~writ_client.security.RegistryAuth`
                or ``(username, password)``); never in the URL.
            schema_registry_tls: TLS to an https registry: a CA to trust, a client certificate.
            max_intent_bytes, max_json_depth: the owners' ``WRIT_MAX_INTENT_BYTES`` (262,144) and
                ``WRIT_MAX_JSON_DEPTH`` (32), when they run with other values: an intent over either is refused here
                (:class:`IntentRefused`), since owners dead-letter it without a reply.

        :meth:`from_env` takes the brokers, the registry, the topics and all of the security settings from
        the environment variables writ's TypeScript side reads.
        """
        if signer is not None:
            if not isinstance(signer, IntentSigner):
                raise TypeError("signer must have a key_id and a sign(data) -> bytes method (e.g. Ed25519Signer)")
            if not isinstance(signer.key_id, str) or not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", signer.key_id):
                raise SigningError("signing key id must be 1–64 of A-Z a-z 0-9 . _ : -")
        self.audience = check_audience(audience, has_signer=signer is not None)
        if isinstance(schema_registry_auth, tuple):
            schema_registry_auth = RegistryAuth(*schema_registry_auth)
        self.kafka_security = kafka_security
        self.schema_registry_auth = schema_registry_auth
        self.schema_registry_tls = schema_registry_tls
        self.brokers = brokers if isinstance(brokers, str) else ",".join(brokers)
        if not self.brokers.strip():
            raise ValueError("brokers: at least one host:port")
        if not isinstance(agent_id, str) or not 1 <= utf16_length(agent_id) <= 128:
            raise ValueError(f"agent_id must be a string of 1 to 128 characters (UTF-16 code units, as owners count), got {agent_id!r:.200}")
        for name, topic in (("reply_topic", reply_topic), ("intents_topic", intents_topic), ("human_topic", human_topic), ("ledger_topic", ledger_topic)):
            if not isinstance(topic, str) or not _TOPIC.fullmatch(topic):
                raise ValueError(f"{name} must be a Kafka topic name (1–249 of a-z A-Z 0-9 . _ -), got {topic!r:.300}")
        if not isinstance(reply_topic_prefix, str) or not _REPLY_PREFIX.fullmatch(reply_topic_prefix):
            raise ValueError(f"reply_topic_prefix must be the start of a Kafka topic name (1–248 of a-z A-Z 0-9 . _ -), got {reply_topic_prefix!r:.300}")
        if not reply_topic.startswith(reply_topic_prefix) or len(reply_topic) == len(reply_topic_prefix):
            # As TypeScript's ClientConfig: a client on another topic would only ever time out.
            raise ValueError(
                f"reply_topic {reply_topic} does not start with the owners' reply prefix {reply_topic_prefix} (reply_topic_prefix, their "
                "WRIT_REPLY_TOPIC_PREFIX): they would dead-letter every intent reply_topic_not_allowed, unanswered"
            )
        if client_id is not None and (not isinstance(client_id, str) or not client_id):
            raise ValueError(f"client_id must be a non-empty string when given, got {client_id!r}")
        for name, count in (
            ("reply_topic_partitions", reply_topic_partitions),
            ("replication_factor", replication_factor),
            ("max_intent_bytes", max_intent_bytes),
            ("max_json_depth", max_json_depth),
        ):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"{name} must be an integer of at least 1, got {count!r}")
        submit_timeout = _seconds("submit_timeout", submit_timeout)
        self.agent_id = agent_id
        self.reply_topic = reply_topic
        self.reply_topic_prefix = reply_topic_prefix
        self.intents_topic = intents_topic
        self.human_topic = human_topic
        self.ledger_topic = ledger_topic
        self.schema_registry_url = schema_registry_url or None
        self.client_id = client_id or f"writ-client-{agent_id}"
        self.reply_topic_partitions = reply_topic_partitions
        self.replication_factor = replication_factor
        self.submit_timeout = submit_timeout
        self.signer = signer
        self.max_intent_bytes = max_intent_bytes
        self.max_json_depth = max_json_depth
        self._extra = dict(kafka_config or {})
        try:
            self._message_max_bytes = int(self._extra.get("message.max.bytes", _MESSAGE_MAX_BYTES))
        except (TypeError, ValueError):
            self._message_max_bytes = 0
        if self._message_max_bytes < 1:
            raise ValueError(f"kafka_config['message.max.bytes'] must be a positive integer, got {self._extra.get('message.max.bytes')!r}")
        self.codec = WireCodec(self.schema_registry_url, frame=frame_values, auth=schema_registry_auth, tls=schema_registry_tls)
        # Every submission waiting for an intent id (the same intent may be submitted again while one waits): a
        # reply settles them all, and one that ends takes only its own waiter away.
        self._waiting: dict[str, list[concurrent.futures.Future[Reply]]] = {}
        # The first provisional rejection (PROVISIONAL_REJECTIONS) each waiter got, returned at its deadline if nothing else came.
        self._provisional: dict[concurrent.futures.Future[Reply], RejectedReply] = {}
        self._submitted: OrderedDict[str, tuple[EntityRef, str]] = OrderedDict()
        self._listeners: set[Callable[[Reply], None]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="writ-probe")
        self._last_probe: tuple[float, concurrent.futures.Future[dict[int, _Ends] | None]] | None = None
        self._admin: AdminClient | None = None
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._reply_partitions = 0
        self._auth_error: KafkaError | None = None
        #: Broker address → when it first refused the login or the TLS setup (error_cb), for start()'s decision.
        self._refused_at: dict[str, float] = {}
        self._last_error: KafkaError | None = None
        self._started = False
        self._closed = False

    @classmethod
    def from_env(cls, *, agent_id: str, reply_topic: str, env: Mapping[str, str] | None = None, **kwargs: Any) -> WritClient:
        """A client configured from the environment, as writ's TypeScript CLI and MCP server are.

        ``KAFKA_BROKERS`` (unless ``brokers=`` is given), ``SCHEMA_REGISTRY_URL``
        (unless ``schema_registry_url=`` is given), and the security variables
        of :meth:`ConnectionSecurity.from_env <writ_client.security.ConnectionSecurity.from_env>`
        (``KAFKA_SSL_CA_FILE``, ``KAFKA_SASL_MECHANISM``, ``KAFKA_SASL_USERNAME``,
        ``KAFKA_SASL_PASSWORD`` or ``KAFKA_SASL_PASSWORD_FILE``, ``SCHEMA_REGISTRY_USERNAME``,
        ``SCHEMA_REGISTRY_PASSWORD(_FILE)``, ``SCHEMA_REGISTRY_CA_FILE``…), the topics' names where
        the owners are given other ones (``WRIT_INTENTS_TOPIC``, ``WRIT_HUMAN_TOPIC``, ``WRIT_LEDGER_TOPIC``,
        ``WRIT_REPLY_TOPIC_PREFIX``), and
        the owners' admission bounds where they are not the defaults (``WRIT_MAX_INTENT_BYTES``,
        ``WRIT_MAX_JSON_DEPTH``), and with a ``signer=`` the owners' ``WRIT_SIGNING_AUDIENCE`` as ``audience``; a
        setting given as an argument wins over its variable. Other arguments go to the constructor.
        """
        env = os.environ if env is None else env
        if "brokers" not in kwargs:
            brokers = (env.get("KAFKA_BROKERS") or "").strip()
            if not brokers:
                raise ValueError("KAFKA_BROKERS is not set (or pass brokers=)")
            kwargs["brokers"] = brokers
        if "schema_registry_url" not in kwargs:
            kwargs["schema_registry_url"] = (env.get("SCHEMA_REGISTRY_URL") or "").strip() or None
        for arg, variable in (
            ("intents_topic", "WRIT_INTENTS_TOPIC"),
            ("human_topic", "WRIT_HUMAN_TOPIC"),
            ("ledger_topic", "WRIT_LEDGER_TOPIC"),
            ("reply_topic_prefix", "WRIT_REPLY_TOPIC_PREFIX"),
        ):
            if arg not in kwargs and (env.get(variable) or "").strip():
                kwargs[arg] = env[variable].strip()
        for arg, variable in (("max_intent_bytes", "WRIT_MAX_INTENT_BYTES"), ("max_json_depth", "WRIT_MAX_JSON_DEPTH")):
            text = (env.get(variable) or "").strip()
            if arg not in kwargs and text:
                if not re.fullmatch(r"[1-9][0-9]{0,9}", text):
                    raise ValueError(f"{variable} must be a positive integer, got {text!r:.40}")
                kwargs[arg] = int(text)
        # The owners' audience, for a client that signs (an unsigned one has none to give: owners check signed records only).
        # As owners read it: only an empty value is unset; " prod" is refused naming the variable, not quietly trimmed
        # into an audience the owners (which refuse it) would never have.
        if "audience" not in kwargs and kwargs.get("signer") is not None and env.get("WRIT_SIGNING_AUDIENCE"):
            try:
                kwargs["audience"] = check_audience(env["WRIT_SIGNING_AUDIENCE"], has_signer=True)
            except AudienceInvalid as err:
                raise AudienceInvalid(f"WRIT_SIGNING_AUDIENCE: {err}") from None
        security = ConnectionSecurity.from_env(env)
        kwargs.setdefault("kafka_security", security.kafka)
        kwargs.setdefault("schema_registry_auth", security.schema_registry_auth)
        kwargs.setdefault("schema_registry_tls", security.schema_registry_tls)
        return cls(agent_id=agent_id, reply_topic=reply_topic, **kwargs)

    # -- lifecycle ------------------------------------------------------------------------------

    def _security_conf(self) -> dict[str, Any]:
        conf = self.kafka_security.librdkafka_config() if self.kafka_security is not None else {}
        return {**conf, "error_cb": self._on_kafka_error}

    def _conf(self, **more: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.brokers, "client.id": self.client_id, **self._security_conf(), **self._extra, **more}

    def _on_kafka_error(self, err: KafkaError) -> None:
        """librdkafka's error callback: remembers the first authentication or TLS failure, which brokers refused and when,
        and the last error (for :meth:`start`'s error)."""
        self._last_error = err
        if err.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
            named = _ERROR_BROKER.match(err.str())
            self._refused_at.setdefault(_broker_address(named.group(1)) if named else err.str(), time.monotonic())
            if self._auth_error is None:
                self._auth_error = err
                # librdkafka's text names the broker, the mechanism and the reason, never the password.
                _log.warning("Kafka connection refused: %s", err.str())

    def _raise_connection_error(self, err: KafkaException) -> None:
        """Replaces a timeout that hides why the brokers could not be reached (authentication, TLS, transport) by that reason."""
        if self._admin is not None:
            self._admin.poll(0)  # serves error_cb
        auth = self._auth_error
        if auth is not None:
            who = f" as {self.kafka_security.sasl_username} ({self.kafka_security.sasl_mechanism})" if self.kafka_security and self.kafka_security.sasl else ""
            what = "authenticate to" if auth.code() == KafkaError._AUTHENTICATION else "set up TLS with"
            raise KafkaException(KafkaError(auth.code(), f"could not {what} the Kafka brokers{who}: {auth.str()}", fatal=True)) from err
        last = self._last_error
        original = err.args[0] if err.args and isinstance(err.args[0], KafkaError) else None
        if last is not None and original is not None and original.code() == KafkaError._TIMED_OUT:
            protocol = self._conf().get("security.protocol", "PLAINTEXT")
            raise KafkaException(
                KafkaError(original.code(), f"{original.str()} (security.protocol {protocol}; last connection error: {last.str()})")
            ) from err

    def producer_config(self) -> dict[str, Any]:
        """The librdkafka configuration intents are produced with (with the SASL password, when set: never log it)."""
        return {
            "bootstrap.servers": self.brokers,
            "client.id": self.client_id,
            **self._security_conf(),
            "linger.ms": 2,
            # How long a send may take, retries included, before submit() raises.
            "message.timeout.ms": 60_000,
            **self._extra,
            # Not overridable: the wire contract.
            # Retries of Kafka sends only (idempotent: no duplicate records); never a re-send at the writ layer.
            "enable.idempotence": True,
            "acks": "all",
            # Java's DefaultPartitioner for keyed records: an entity lands on the partition every client picks.
            "partitioner": "murmur2_random",
            # Owners and operators create writ.intents with its fixed partition count; a send never creates it.
            "allow.auto.create.topics": False,
        }

    def start(self) -> WritClient:
        """Creates the reply topic if missing, starts reading it at its read_committed end, connects the producer."""
        if self._started:
            return self
        for warning in transport_warnings(self.kafka_security, self.schema_registry_url, self.schema_registry_auth, self.schema_registry_tls):
            _log.warning(warning)
        self._admin = AdminClient(self._conf())
        try:
            self._reply_partitions = self._ensure_reply_topic()
        except KafkaException as err:
            try:
                self._raise_connection_error(err)
            finally:
                self._admin = None
            raise
        except BaseException:
            self._admin = None
            raise
        starts = self._start_offsets()
        self._producer = Producer(self.producer_config())
        self._consumer = Consumer(
            self._conf(
                **{
                    # Assigned partitions, no group membership: the group id only names the consumer.
                    "group.id": f"writ.client.{self.agent_id}.{uuid.uuid4()}",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest",
                    "fetch.wait.max.ms": 100,
                    "enable.partition.eof": False,
                }
            )
        )
        self._consumer.assign([TopicPartition(self.reply_topic, p, off) for p, off in starts.items()])
        for target, name in ((self._consume_loop, "writ-replies"), (self._poll_producer_loop, "writ-producer")):
            t = threading.Thread(target=target, name=f"{name}-{self.agent_id}", daemon=True)
            t.start()
            self._threads.append(t)
        self._started = True
        return self

    def close(self) -> None:
        """Stops reading replies and flushes the producer. Submits waiting for a reply end at once as ``unknown`` with
        ``reason="client_closed"`` (nothing will read their replies); later ones raise :class:`ClientClosed`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiting = [waiter for waiters in self._waiting.values() for waiter in waiters]
        self._stop.set()
        # Before the threads are joined and the producer flushed, which takes seconds: their deadlines may be far off.
        for waiter in waiting:
            try:
                waiter.set_exception(ClientClosed())
            except concurrent.futures.InvalidStateError:
                pass  # its reply came first
        for t in self._threads:
            t.join(timeout=10)
        if self._producer is not None:
            self._producer.flush(5)
        if self._consumer is not None:
            self._consumer.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        # librdkafka's handles go with their last reference (a client that failed to start stops retrying now).
        self._admin = self._producer = self._consumer = None

    def __enter__(self) -> WritClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> WritClient:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed()
        if not self._started:
            raise RuntimeError("the client is not started (use start() or a with block)")

    @property
    def reply_partitions(self) -> int:
        return self._reply_partitions

    def _ensure_reply_topic(self) -> int:
        assert self._admin is not None
        futures = self._admin.create_topics(
            [NewTopic(self.reply_topic, num_partitions=self.reply_topic_partitions, replication_factor=self.replication_factor)],
            request_timeout=15,
        )
        created = futures[self.reply_topic]
        # librdkafka logs in again after a refused login until the request times out; its error_cb (served by poll)
        # says that the credentials or the TLS setup are refused: once every bootstrap broker has refused for a while
        # (_REFUSAL_GRACE_S), the start ends there (start() says why). A refusal by some only, or one that passes,
        # leaves the request to decide.
        while not created.done():
            self._admin.poll(0.1)
            if self._auth_error is not None and _refused_for_good(self._refused_at, self.brokers, time.monotonic()):
                raise KafkaException(self._auth_error)
        try:
            created.result()
        except KafkaException as err:
            code = err.args[0].code()
            if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise KafkaException(
                    KafkaError(code, f"not authorized to create the reply topic {self.reply_topic}: the agent's Kafka user needs CREATE, READ and DESCRIBE on it (ACLs)")
                ) from err
            if code != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        # Owners ask the cluster again about a reply topic they have not seen, on every intent
        # (src/owner/topic-directory.ts): an intent sent right after the topic has leaders finds it.
        deadline = time.monotonic() + 30
        while True:
            topic = self._admin.list_topics(self.reply_topic, timeout=5).topics.get(self.reply_topic)
            if topic is not None and topic.error is None and topic.partitions and all(p.leader >= 0 for p in topic.partitions.values()):
                return len(topic.partitions)
            if time.monotonic() > deadline:
                raise TimeoutError(f"reply topic {self.reply_topic} has no leaders after 30 s")
            time.sleep(0.1)

    def _start_offsets(self) -> dict[int, int]:
        # The read_committed end (last stable offset): replies of a transaction still open are past it and are read once committed.
        deadline = time.monotonic() + 30
        while True:
            ends = self._end_offsets()
            if ends is not None:
                return {p: e.last_stable for p, e in ends.items()}
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read the end offsets of {self.reply_topic}")
            time.sleep(0.2)

    def _end_offsets(self) -> dict[int, _Ends] | None:
        """Both ends of every reply partition, or None when they cannot be read now."""
        assert self._admin is not None
        spec = {TopicPartition(self.reply_topic, p): OffsetSpec.latest() for p in range(self._reply_partitions)}
        try:
            committed = self._admin.list_offsets(spec, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=5)
            uncommitted = self._admin.list_offsets(spec, isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=5)
            lso = {tp.partition: f.result().offset for tp, f in committed.items()}
            hwm = {tp.partition: f.result().offset for tp, f in uncommitted.items()}
        except KafkaException as err:
            _log.debug("end offsets of %s unavailable: %s", self.reply_topic, err)
            return None
        return {p: _Ends(lso[p], hwm[p]) for p in lso if p in hwm}

    def _ends(self, fresh: bool = False) -> concurrent.futures.Future[dict[int, _Ends] | None]:
        """The reply partitions' ends, probed in the background; shared by submits within a second unless ``fresh``."""
        now = time.monotonic()
        with self._lock:
            if not fresh and self._last_probe is not None and now - self._last_probe[0] < 1.0:
                return self._last_probe[1]
            if self._closed:
                # close() shut the probe's executor down: a submit still waiting ends unknown, never with its error.
                closed: concurrent.futures.Future[dict[int, _Ends] | None] = concurrent.futures.Future()
                closed.set_result(None)
                return closed
            future = self._executor.submit(self._end_offsets)
            self._last_probe = (now, future)
            return future

    # -- background threads ---------------------------------------------------------------------

    def _poll_producer_loop(self) -> None:
        assert self._producer is not None
        while not self._stop.is_set():
            self._producer.poll(0.1)

    def _consume_loop(self) -> None:
        assert self._consumer is not None
        consumer = self._consumer
        while not self._stop.is_set():
            try:
                msg = consumer.poll(0.2)
            except KafkaException as err:  # pragma: no cover - fatal consumer errors
                _log.error("reply consumer failed: %s", err)
                time.sleep(1)
                continue
            if msg is None:
                continue
            try:
                self._read_reply(consumer, msg)
            except Exception:  # noqa: BLE001 - no record may stop the reply thread: its submits would all end unknown
                _log.exception("reply record skipped (%s-%s@%s): reading it failed", msg.topic(), msg.partition(), msg.offset())

    def _read_reply(self, consumer: Consumer, msg: Any) -> None:
        """Decodes one record of the reply topic and hands its reply to whoever waits for it."""
        error = msg.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                _log.warning("reply consumer: %s", error)
            return
        headers: list[Any] = list(msg.headers() or [])
        if any(h[0] == CONTROL_HEADER for h in headers):
            return
        value = msg.value()
        if value is None:
            return
        try:
            reply = parse_reply(self.codec.decode(value, max_depth=REPLY_MAX_DEPTH))
        except RegistryError as err:
            # The registry says nothing about the record: read it again once it answers.
            _log.warning("schema registry unavailable while decoding a reply; retrying: %s", err)
            consumer.seek(TopicPartition(self.reply_topic, int(msg.partition() or 0), int(msg.offset() or 0)))
            self._stop.wait(1.0)
            return
        except (DecodeError, ValidationError) as err:
            reason = err.reason if isinstance(err, DecodeError) else "schema_invalid"
            _log.warning("unreadable reply skipped (%s-%d@%d, %s): %s", msg.topic(), msg.partition(), msg.offset(), reason, str(err)[:300])
            return
        self._dispatch(reply)

    def _dispatch(self, reply: Reply) -> None:
        with self._lock:
            waiters = list(self._waiting.get(reply.intent_id, ()))
            listeners = list(self._listeners)
            if _provisional(reply):
                # Possibly an answer to a forged record naming this intent id: keep waiting for another answer.
                for waiter in waiters:
                    self._provisional.setdefault(waiter, reply)
                waiters = []
        for waiter in waiters:
            try:
                waiter.set_result(reply)
            except concurrent.futures.InvalidStateError:
                pass
        for listener in listeners:
            try:
                listener(reply)
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the reply consumer
                _log.exception("a replies() listener failed")

    # -- intents --------------------------------------------------------------------------------

    def intent_key(self, *, tool: KeyedTool, run_id: str, step_id: str, entity: Any, params: Mapping[str, Any]) -> str:
        """This agent's intent key for a call (``writ_client.intent_key`` with ``agent_id`` filled in)."""
        return intent_key(tool=tool, agent_id=self.agent_id, run_id=run_id, step_id=step_id, entity=entity, params=params)

    def build_intent(self, i: IntentInput | Mapping[str, Any]) -> WriteIntent:
        """The WriteIntent for a call (new intent id, the key, this client's reply topic), without sending it."""
        if not isinstance(i, IntentInput):
            i = IntentInput.model_validate(i)
        return WriteIntent(
            intent_id=str(uuid.uuid4()),
            intent_key=self.intent_key(tool=i.tool, run_id=i.run_id, step_id=i.step_id, entity=i.entity, params=i.params),
            entity=i.entity,
            tool=i.tool.name,
            agent=AgentRef(id=self.agent_id, run_id=i.run_id, step_id=i.step_id, tool_call_id=i.tool_call_id),
            base_version=i.base_version,
            delta=i.delta,
            params=i.params,
            reply_to=self.reply_topic,
            created_at=iso_now(),
            audience=self.audience,
        )

    def submit(
        self, intent: IntentInput | WriteIntent | Mapping[str, Any], *, timeout: float | None = None, on_leased: Literal["wait", "answer"] = "wait"
    ) -> SubmitResult:
        """Publishes the intent and returns its reply, or ``unknown``/``blocked`` at the deadline.

        Never replays on its own: the write may have happened. Submitting the
        same intent key again asks the owner again, and is always safe. A record
        leased to a change that spans records answers other writes
        ``rejected: leased`` with nothing written: ``on_leased="wait"`` (the
        default, as TypeScript's ``onLeased``) submits it again, with a new intent
        id and the same key, backing off, until the deadline; ``"answer"``
        returns that reply.
        """
        return self.submit_all([intent], timeout=timeout, on_leased=on_leased)[0]

    def submit_all(
        self,
        intents: Sequence[IntentInput | WriteIntent | Mapping[str, Any]],
        *,
        timeout: float | None = None,
        on_leased: Literal["wait", "answer"] = "wait",
    ) -> list[SubmitResult]:
        """Publishes many intents at once and returns each reply (or ``unknown``/``blocked``), in order.

        Raises :class:`~writ_client.canonical.CanonicalJsonError` (``not_canonical``) before anything is
        sent when any value in an intent has no canonical JSON (a lone surrogate, NaN, ±Infinity):
        owners would refuse it, and no signature can cover it; :class:`IntentRefused` (``too_large``,
        ``too_deep``) before anything is sent when an intent is over the owners' admission bounds, which they
        dead-letter without a reply; ``KafkaException`` (``MSG_SIZE_TOO_LARGE``) before anything is sent when an
        intent's record is over the producer's ``message.max.bytes``.

        A send that fails raises when no intent of the batch was sent. When some were, each intent gets its
        outcome: the reply of those sent, ``unknown`` (its message says why) for those whose send failed or
        that were never handed to the producer. ``on_leased``: as in :meth:`submit`.
        """
        self._check_open()
        if on_leased not in ("wait", "answer"):
            raise ValueError(f'on_leased must be "wait" or "answer", got {on_leased!r:.40}')
        wait = self.submit_timeout if timeout is None else _seconds("timeout", timeout)
        deadline = time.monotonic() + wait
        built = [i if isinstance(i, WriteIntent) else self.build_intent(i) for i in intents]
        out = self._send_and_wait(built, deadline)
        if on_leased == "answer":
            return out
        # A record leased to a change: nothing was written; ask again (a new submission of the same key) until the deadline.
        for round_ in itertools.count():
            again = [i for i, r in enumerate(out) if isinstance(r, RejectedReply) and r.reason == "leased" and built[i].lease is None]
            if not again or time.monotonic() >= deadline:
                return out
            # close() ends the wait: the answers so far stand, the leased ones still `leased`.
            if self._stop.wait(backoff_until(round_, deadline)) or time.monotonic() >= deadline:
                return out
            resent = [built[i].model_copy(update={"intent_id": str(uuid.uuid4()), "created_at": iso_now()}) for i in again]
            try:
                answers = self._send_and_wait(resent, deadline)
            except (KafkaException, ClientClosed):
                # Nothing of the resend was sent: the answers so far stand, the leased ones still `leased`.
                return out
            for j, i in enumerate(again):
                built[i], out[i] = resent[j], answers[j]
        raise AssertionError("unreachable")

    def _send_and_wait(self, built: list[WriteIntent], deadline: float) -> list[SubmitResult]:
        """Sends the intents and waits for their replies until ``deadline`` (monotonic), then probes for the rest."""
        # Signed for this client's deployment (its audience), whoever built the intent (lease and undo intents too).
        built = [self._with_audience(intent) for intent in built]
        # What goes on the wire, checked (and signed), encoded and size-checked before anything waits or is sent.
        records = [self._record(intent, *self._prepare(intent)) for intent in built]
        with self._lock:
            for intent in built:
                self._remember(intent)
        return self._exchange(built, records, deadline)

    def _exchange(
        self,
        built: Sequence[_Sent],
        records: list[tuple[bytes, bytes, list[tuple[str, str]]]],
        deadline: float,
        *,
        unknown_message: str | None = None,
        closed_message: str = _CLOSED_UNKNOWN,
    ) -> list[SubmitResult]:
        """Produces the records and waits for the answers (keyed by each one's ``intent_id``) until ``deadline``, or
        until :meth:`close`, which ends each wait ``unknown`` (``client_closed``, ``closed_message``)."""
        # The reply partitions' ends as the wait begins: at the deadline, an end that has not moved tells a blocked topic from a slow owner.
        before = self._ends()
        waiters: list[concurrent.futures.Future[Reply]] = []
        with self._lock:
            # Closed since the caller looked: nothing is sent, as for a submit after close().
            if self._closed:
                raise ClientClosed()
            for intent in built:
                fut: concurrent.futures.Future[Reply] = concurrent.futures.Future()
                self._waiting.setdefault(intent.intent_id, []).append(fut)
                waiters.append(fut)
        try:
            # Raises when nothing was sent; else the intents whose send failed, with their outcome.
            failed = self._produce(built, records)
            with self._lock:
                for i in failed:
                    self._forget(built[i].intent_id, waiters[i])
            for i, outcome in failed.items():
                try:
                    waiters[i].set_result(outcome)
                except concurrent.futures.InvalidStateError:
                    pass  # its reply came first
            # Every reply until the one deadline, then one probe of the reply partitions for all that had none.
            concurrent.futures.wait(waiters, timeout=max(0.0, deadline - time.monotonic()))
            late = [intent for intent, fut in zip(built, waiters) if not fut.done()]
            with self._lock:
                provisional = {i.intent_id: self._provisional[fut] for i, fut in zip(built, waiters) if not fut.done() and fut in self._provisional}
            late = [intent for intent in late if intent.intent_id not in provisional]
            at_deadline: dict[str, SubmitResult] = {
                intent_id: r.model_copy(update={"message": f"{r.message} (No other answer came before the deadline; this rejection may come from a record that was not this client's, naming its intent id.)"})
                for intent_id, r in provisional.items()
            }
            at_deadline |= dict(zip((intent.intent_id for intent in late), self._timed_out(late, before, unknown_message))) if late else {}
            return [
                at_deadline[intent.intent_id]
                if not fut.done()
                # A waiter close() ended: no reply can be read any more.
                else UnknownOutcome(intent_id=intent.intent_id, intent_key=intent.intent_key, reason="client_closed", message=closed_message)
                if isinstance(fut.exception(), ClientClosed)
                else fut.result()
                for intent, fut in zip(built, waiters)
            ]
        finally:
            with self._lock:
                for intent, fut in zip(built, waiters):
                    self._forget(intent.intent_id, fut)

    def _forget(self, intent_id: str, waiter: concurrent.futures.Future[Reply]) -> None:
        """Removes this waiter for ``intent_id``, and only it (the caller holds the lock)."""
        self._provisional.pop(waiter, None)
        waiters = self._waiting.get(intent_id)
        if waiters is None or waiter not in waiters:
            return
        waiters.remove(waiter)
        if not waiters:
            del self._waiting[intent_id]

    async def asubmit(
        self, intent: IntentInput | WriteIntent | Mapping[str, Any], *, timeout: float | None = None, on_leased: Literal["wait", "answer"] = "wait"
    ) -> SubmitResult:
        """:meth:`submit` for asyncio code (runs in a worker thread)."""
        return await asyncio.to_thread(self.submit, intent, timeout=timeout, on_leased=on_leased)

    async def asubmit_all(
        self, intents: Sequence[IntentInput | WriteIntent | Mapping[str, Any]], *, timeout: float | None = None, on_leased: Literal["wait", "answer"] = "wait"
    ) -> list[SubmitResult]:
        return await asyncio.to_thread(self.submit_all, intents, timeout=timeout, on_leased=on_leased)

    def change(self, change: ChangeInput | Mapping[str, Any]) -> ChangeResult:
        """Runs a change that spans records as a saga under leases held by the records' owners (TypeScript's
        ``client.change``; :func:`writ_client.change.run_change`): every step applied, or none left."""
        from .change import run_change

        return run_change(self, change)

    async def achange(self, change: ChangeInput | Mapping[str, Any]) -> ChangeResult:
        """:meth:`change` for asyncio code (runs in a worker thread)."""
        return await asyncio.to_thread(self.change, change)

    def build_undo(
        self,
        target: str | AppliedReply | Mapping[str, Any],
        *,
        run_id: str = "undo",
        step_id: str | None = None,
        tool_call_id: str | None = None,
        from_ledger: bool = False,
        timeout: float | None = None,
    ) -> WriteIntent:
        """The undo of an applied write, without sending it: intent key ``undo_intent_key(<its key>)`` (the same for
        every submission, by any agent), the write's record and tool, base version ``"ledger"``, no delta, no params.

        ``target``: the write's applied reply (owners name its tool on it), its intent key when this client
        submitted it (the last 10,000 are remembered), or ``{"intentKey", "entity", "tool"}``. ``from_ledger``:
        an intent key this client does not remember is looked up in the owners' ledger (the client's
        ``ledger_topic``, read from its start to its end: slow on a large ledger, and it needs read access to
        it), as ``writ undo <key>`` does; ``timeout`` (seconds, default the client's ``submit_timeout``) bounds
        that read (``TimeoutError`` past it).
        """
        lookup = self.submit_timeout if timeout is None else _seconds("timeout", timeout)
        key, entity, tool = self._undone(target, from_ledger=from_ledger, timeout=lookup)
        return WriteIntent(
            intent_id=str(uuid.uuid4()),
            intent_key=undo_intent_key(key),
            entity=entity,
            tool=tool,
            agent=AgentRef(id=self.agent_id, run_id=run_id, step_id=step_id or f"undo-{key[:16]}", tool_call_id=tool_call_id),
            base_version=LEDGER_VERSION,
            delta=[],
            params={},
            reply_to=self.reply_topic,
            created_at=iso_now(),
            undo=UndoRef(intent_key=key),
        )

    def undo(
        self,
        target: str | AppliedReply | Mapping[str, Any],
        *,
        timeout: float | None = None,
        run_id: str = "undo",
        step_id: str | None = None,
        tool_call_id: str | None = None,
        from_ledger: bool = False,
    ) -> SubmitResult:
        """Submits the undo of an applied write, once (TypeScript's ``client.undo``): the tool's declared
        compensating change, applied by the record's owner only on the version the write produced.

        Returns like :meth:`submit`: ``applied`` (its ``undo_of`` names the write); ``conflict`` with the current
        record when it changed since the write (nothing undone); ``rejected`` with ``undo_target_unknown``,
        ``undo_target_not_applied``, ``undo_target_mismatch``, ``undo_not_declared`` or ``undo_failed``.
        Submitting it again (any agent, any run) is a repeat, answered from the ledger. ``run_id`` and
        ``step_id`` are carried for correlation only; they are not part of the undo's key. ``target`` and
        ``from_ledger`` as for :meth:`build_undo`; ``timeout`` bounds the ledger read, when there is one, and the
        submission, each.
        """
        undo = self.build_undo(target, run_id=run_id, step_id=step_id, tool_call_id=tool_call_id, from_ledger=from_ledger, timeout=timeout)
        return self.submit(undo, timeout=timeout)

    async def aundo(self, target: str | AppliedReply | Mapping[str, Any], **options: Unpack[_UndoOptions]) -> SubmitResult:
        """:meth:`undo` for asyncio code (runs in a worker thread); the same keyword arguments."""
        return await asyncio.to_thread(self.undo, target, **options)

    def resolve(
        self,
        escalation: Escalation | Mapping[str, Any],
        decision: Decision,
        *,
        base_version: str | None = None,
        delta: Sequence[JsonPatchOp | Mapping[str, Any]] | None = None,
        message: str | None = None,
        timeout: float | None = None,
    ) -> SubmitResult:
        """An operator's decision on an escalation from ``writ.human`` (TypeScript's ``client.resolve``), carried out
        by the record's owner: ``apply`` writes the escalated intent on the record as it is at ``base_version``
        (default: the version the escalation showed), ``discard`` writes nothing, ``return`` hands it back to the
        agent with ``message``. This client's agent id is the operator's (with an agent registry it must be
        allowed ``writ.resolve``, and sign with its key).

        Returns the owner's answer to this client: ``applied`` (``resolved_by``: this operator); ``rejected`` with
        ``escalation_discarded`` or ``returned_by_operator`` (carried out), ``resolution_conflict`` (the record
        changed since that version: nothing written, the escalation stays open), ``resolution_delta_required``
        (``apply`` of a tool without a delta function: pass the change as ``delta``), ``patch_path_not_allowed`` /
        ``patch_op_not_allowed`` (the change goes beyond the tool's ``allowedPaths``: nothing written, the escalation
        stays open) or ``resolution_not_applicable`` (not open, or not this intent's); ``unknown`` / ``blocked`` at
        the deadline. The agent gets the outcome on
        its own reply topic. ``escalation``: an :class:`Escalation` (:meth:`read_escalations`) or its JSON object.
        """
        self._check_open()
        wait = self.submit_timeout if timeout is None else _seconds("timeout", timeout)
        deadline = time.monotonic() + wait
        wire = build_resolution(
            escalation, decision, operator=self.agent_id, reply_to=self.reply_topic, base_version=base_version, delta=delta, message=message, audience=self.audience
        )
        what = f"resolution {wire['resolutionId']}"
        # A resolution carries its intent whole one level down, and may carry a change as large: its own bounds.
        bounds = resolution_bounds(self.max_intent_bytes, self.max_json_depth)
        try:
            canonical_json(wire)
        except CanonicalJsonError as err:
            raise _refusal(what, wire, err) from None
        self._check_depth(what, wire, bounds.max_depth)
        if "delta" in wire:
            self._check_depth(f"{what}: its delta", wire["delta"], bounds.delta_max_depth)
            # As owners measure it: compact JSON with numbers as JavaScript writes them, which is the canonical form's length.
            self._check_size(f"{what}: its delta", canonical_json(wire["delta"]).encode("utf-8"), bounds.delta_max_bytes)
        headers = [(KIND_HEADER, "resolution")]
        if self.signer is not None:
            headers.append((SIGNATURE_HEADER, sign_intent(wire, self.signer)))
        value = self.codec.encode(self.intents_topic, "Resolution", wire, subject=resolution_subject(self.intents_topic))
        self._check_size(what, value, bounds.max_bytes)
        record = self._sized(what, entity_key(wire["entity"]).encode("utf-8"), value, headers)
        sent = _ResolutionSent(intent_id=wire["resolutionId"], intent_key=wire["intent"]["intentKey"])
        unknown = "No answer to the resolution before the deadline; look at writ.human and the record before deciding again."
        closed = "This client was closed, so no answer to the resolution can be read; look at writ.human and the record before deciding again."
        return self._exchange([sent], [record], deadline, unknown_message=unknown, closed_message=closed)[0]

    async def aresolve(self, escalation: Escalation | Mapping[str, Any], decision: Decision, **options: Unpack[_ResolveOptions]) -> SubmitResult:
        """:meth:`resolve` for asyncio code (runs in a worker thread); the same keyword arguments."""
        return await asyncio.to_thread(self.resolve, escalation, decision, **options)

    def read_escalations(self, *, topic: str | None = None, open_only: bool = False, timeout: float = 30.0) -> list[EscalationRecord]:
        """Every escalation on ``topic`` (default: the client's ``human_topic``, ``writ.human``), oldest first:
        committed records from the beginning to the end each partition had when reached (``writ escalations
        list``). An escalation stays on the topic after it is decided; ``open_only`` keeps only the cases an owner
        would still take a decision on, by the owners' ledger (the client's ``ledger_topic``, read to its end:
        ``writ escalations list --open``). Records that do not decode or validate are skipped with a warning.
        ``TimeoutError`` when a topic is not read to its end within ``timeout`` seconds."""
        topic = self.human_topic if topic is None else topic
        if not isinstance(topic, str) or not _TOPIC.fullmatch(topic):
            raise ValueError(f"topic must be a Kafka topic name, got {topic!r:.60}")
        if not isinstance(open_only, bool):
            raise ValueError(f"open_only must be True or False, got {open_only!r:.60}")
        return read_escalations(self._conf(), self.codec, topic, timeout=_seconds("timeout", timeout), open_only=open_only, ledger_topic=self.ledger_topic)

    async def aread_escalations(self, *, topic: str | None = None, open_only: bool = False, timeout: float = 30.0) -> list[EscalationRecord]:
        """:meth:`read_escalations` for asyncio code (runs in a worker thread)."""
        return await asyncio.to_thread(self.read_escalations, topic=topic, open_only=open_only, timeout=timeout)

    def _undone(self, target: str | AppliedReply | Mapping[str, Any], *, from_ledger: bool = False, timeout: float) -> tuple[str, EntityRef, str]:
        """The undone write's key, record and tool, from what the caller gave, what this client remembers and,
        with ``from_ledger``, the owners' ledger."""

        def unknown(why: str) -> ValueError:
            return ValueError(f"undo: {why}; pass the write's applied reply, or {{'intentKey', 'entity', 'tool'}}, or from_ledger=True to look the key up in the ledger")

        if isinstance(target, str):
            with self._lock:
                known = self._submitted.get(target)
            if known is not None:
                return target, known[0], known[1]
            if not from_ledger:
                raise unknown(f"intent key {target[:64]} was not submitted by this client")
            if not _INTENT_KEY.fullmatch(target):
                # Checked before the whole ledger is read for it (as `writ undo` does).
                raise ValueError(f"undo: an intent key is 64 lower-case hex characters, got {target!r:.80}")
            entry = latest_ledger_entries(self._conf(), self.codec, self.ledger_topic, {target}, timeout=timeout).get(target)
            if entry is None or entry.entity is None or entry.tool is None:
                raise unknown(f"intent key {target[:64]} is not in {self.ledger_topic}" + (" with its record and tool" if entry is not None else ""))
            return target, EntityRef(type=entry.entity.type, id=entry.entity.id), entry.tool
        if isinstance(target, AppliedReply):
            key, entity, tool = target.intent_key, target.entity, target.tool
        elif isinstance(target, Mapping):
            key = target.get("intentKey", target.get("intent_key"))
            entity, tool = target.get("entity"), target.get("tool")
        else:
            raise unknown(f"cannot undo a {type(target).__name__} (a {getattr(target, 'status', '?')} result has nothing to undo)")
        if not isinstance(key, str):
            raise unknown("no intent key given")
        with self._lock:
            known = self._submitted.get(key)
        if isinstance(tool, KeyedTool):
            tool = tool.name
        record = EntityRef.model_validate(entity) if entity is not None else (known[0] if known else None)
        name = tool if isinstance(tool, str) else (known[1] if known else None)
        if record is None or name is None:
            raise unknown(f"the reply of {key[:64]} does not name its {'tool' if record is not None else 'record'}")
        return key, EntityRef(type=record.type, id=record.id), name

    def _with_audience(self, intent: WriteIntent) -> WriteIntent:
        """``intent`` with this client's audience; one that names another is refused (:class:`AudienceInvalid`)."""
        if self.audience is None or intent.audience == self.audience:
            return intent
        if intent.audience is not None:
            raise AudienceInvalid(f"intent {intent.intent_id} names audience {intent.audience!r}, not this client's ({self.audience}); nothing was sent")
        return intent.model_copy(update={"audience": self.audience})

    def _remember(self, intent: WriteIntent) -> None:
        """Notes a submitted intent's record and tool by its key (the caller holds the lock)."""
        self._submitted.pop(intent.intent_key, None)
        self._submitted[intent.intent_key] = (intent.entity, intent.tool)
        while len(self._submitted) > _REMEMBERED:
            self._submitted.popitem(last=False)

    def _prepare(self, intent: WriteIntent) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """The intent's wire object and its record headers; refuses one with no canonical JSON."""
        # pydantic's JSON mode rewrites a key holding a surrogate code point (lone, or a pair written as two code
        # points) to U+FFFD, or cannot write it: the Python-mode dump holds the strings as given.
        python = intent.model_dump(by_alias=True)
        try:
            wire: dict[str, Any] = intent.to_wire()
        except UnicodeEncodeError:
            wire = python
        try:
            text = canonical_json(python)
        except CanonicalJsonError as err:
            if err.code != "not_json":
                raise _refusal(f"intent {intent.intent_id}", python, err) from None
            # A value only JSON mode writes (a datetime, a UUID…): the wire form is the one to check.
            text = None
        try:
            if text is not None and canonical_json(wire) != text:
                # JSON mode changed a string: send the values as given (as JavaScript holds them, pairs joined).
                wire = json.loads(text)
            canonical = canonical_json(wire)
        except CanonicalJsonError as err:
            raise _refusal(f"intent {intent.intent_id}", wire, err) from None
        self._check_depth(f"intent {intent.intent_id}", wire)
        # Owners bound the canonical form too (numbers as JavaScript writes them: 1e+16 is 17 bytes there), the
        # intent as they write it again in an escalation and an operator sends it back.
        self._check_size(f"intent {intent.intent_id} (as canonical JSON)", canonical.encode("utf-8"))
        headers = [(SIGNATURE_HEADER, sign_intent(wire, self.signer))] if self.signer is not None else []
        return wire, headers

    def _check_depth(self, what: str, wire: Any, limit: int | None = None) -> None:
        """Refuses a value nested deeper than owners accept (``too_deep``): they dead-letter it without a reply.
        ``limit``: an intent's (``WRIT_MAX_JSON_DEPTH``) unless given (a resolution's, from :func:`resolution_bounds`)."""
        limit = self.max_json_depth if limit is None else limit
        if json_depth(wire, limit) > limit:
            raise IntentRefused("too_deep", f"{what} not sent: it is nested deeper than {limit} levels, which owners refuse (WRIT_MAX_JSON_DEPTH); make it shallower")

    def _check_size(self, what: str, value: bytes, limit: int | None = None) -> None:
        """Refuses an encoded value larger than owners accept (``too_large``): they dead-letter it without a reply.
        ``limit``: an intent's (``WRIT_MAX_INTENT_BYTES``) unless given (a resolution's, from :func:`resolution_bounds`)."""
        limit = self.max_intent_bytes if limit is None else limit
        if len(value) > limit:
            raise IntentRefused("too_large", f"{what} not sent: it is {len(value)} bytes encoded; owners refuse more than {limit} (WRIT_MAX_INTENT_BYTES); make it smaller")

    def _record(self, intent: WriteIntent, wire: dict[str, Any], headers: list[tuple[str, str]]) -> tuple[bytes, bytes, list[tuple[str, str]]]:
        """The record of an intent (key, value, headers); refuses one over the producer's ``message.max.bytes`` before anything is sent."""
        # The value is the object signed: the owner verifies the signature against what it parses from it.
        value = self.codec.encode(self.intents_topic, "WriteIntent", wire)
        self._check_size(f"intent {intent.intent_id}", value)
        return self._sized(f"intent {intent.intent_id}", entity_key(intent.entity).encode("utf-8"), value, headers)

    def _sized(self, what: str, key: bytes, value: bytes, headers: list[tuple[str, str]]) -> tuple[bytes, bytes, list[tuple[str, str]]]:
        """The record; refuses one over the producer's ``message.max.bytes`` before anything is sent."""
        limit = self._message_max_bytes
        size = len(key) + len(value) + sum(len(k) + len(v.encode("utf-8")) for k, v in headers) + _RECORD_OVERHEAD
        if size > limit:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, f"{what} not sent (nor any of its batch): its record is about {size} bytes, over message.max.bytes {limit}"))
        return key, value, headers

    def _produce(self, intents: Sequence[_Sent], records: list[tuple[bytes, bytes, list[tuple[str, str]]]]) -> dict[int, UnknownOutcome]:
        """Produces the records; raises when none was sent, else returns the outcome of each intent whose send failed (by index).
        Raises :class:`ClientClosed`, nothing sent, when :meth:`close` came after the caller's own check."""
        # close() may have come since the caller registered its waiters (ending them) and may drop the producer.
        with self._lock:
            producer = self._producer
            if self._closed or producer is None:
                raise ClientClosed()
        deliveries: list[tuple[int, concurrent.futures.Future[None]]] = []
        failed: dict[int, UnknownOutcome] = {}
        first_error: BaseException | None = None
        for i, (key, value, headers) in enumerate(records):
            done: concurrent.futures.Future[None] = concurrent.futures.Future()

            def on_delivery(err: KafkaError | None, _msg: Any, done: concurrent.futures.Future[None] = done) -> None:
                if err is not None:
                    done.set_exception(KafkaException(err))
                else:
                    done.set_result(None)

            try:
                while True:
                    try:
                        producer.produce(self.intents_topic, value=value, key=key, headers=headers or None, on_delivery=on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.05)
            except Exception as err:  # noqa: BLE001 - the intents before it were sent: they get their outcomes
                if i == 0:
                    raise
                first_error = err
                for j in range(i, len(records)):
                    failed[j] = UnknownOutcome(
                        intent_id=intents[j].intent_id,
                        intent_key=intents[j].intent_key,
                        message=f"Not sent: the producer refused the batch at this intent ({str(err)[:300]}). Nothing was written for it: submit the same intent key again to send it.",
                    )
                break
            deliveries.append((i, done))
        producer.poll(0)
        delivered = 0
        for i, done in deliveries:
            try:
                done.result()  # the producer's message.timeout.ms bounds this
                delivered += 1
            except Exception as err:  # noqa: BLE001 - one failed send says nothing about the others
                first_error = first_error or err
                failed[i] = UnknownOutcome(
                    intent_id=intents[i].intent_id,
                    intent_key=intents[i].intent_key,
                    message=f"The send failed ({str(err)[:300]}). The write may or may not have happened: do not assume it failed; submit the same intent key again to ask.",
                )
        if delivered == 0 and first_error is not None:
            raise first_error
        return failed

    def _timed_out(
        self, intents: Sequence[_Sent], before: concurrent.futures.Future[dict[int, _Ends] | None], unknown_message: str | None = None
    ) -> list[SubmitResult]:
        """The deadline passed: ``blocked`` for an intent whose reply partition is held by an open transaction, else ``unknown``.

        One fresh probe serves every intent of the batch, and the whole step waits at most :data:`_PROBE_TIMEOUT` seconds.
        """
        probe_deadline = time.monotonic() + _PROBE_TIMEOUT
        fresh = self._ends(fresh=True)
        try:
            start = before.result(timeout=max(0.0, probe_deadline - time.monotonic()))
            now = fresh.result(timeout=max(0.0, probe_deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - a probe that failed says nothing: unknown
            start = now = None
        return [self._outcome_at_deadline(intent, start, now, unknown_message) for intent in intents]

    def _outcome_at_deadline(self, intent: _Sent, start: dict[int, _Ends] | None, now: dict[int, _Ends] | None, unknown_message: str | None = None) -> SubmitResult:
        unknown = UnknownOutcome(
            intent_id=intent.intent_id,
            intent_key=intent.intent_key,
            message=unknown_message
            or "No reply before the deadline. The write may or may not have happened: do not assume it failed; submit the same intent key again to ask.",
        )
        # The owner keys a reply by its intent id, with the same partitioner.
        partition = partition_for(intent.intent_id, self._reply_partitions)
        was = start.get(partition) if start else None
        is_ = now.get(partition) if now else None
        if was is None or is_ is None or was.last_stable != is_.last_stable or is_.last_stable >= is_.high_watermark:
            return unknown
        topic = self.reply_topic
        message = (
            f"reply topic blocked by an open transaction at offset {is_.last_stable} ({topic}-{partition}, high watermark {is_.high_watermark}): "
            "replies past it are invisible to read_committed readers. The write may or may not have happened; ask again once it is healed (writ doctor)."
        )
        _log.warning("reply partition blocked: %s-%d at %d (high watermark %d)", topic, partition, is_.last_stable, is_.high_watermark)
        return BlockedOutcome(intent_id=intent.intent_id, intent_key=intent.intent_key, topic=topic, partition=partition, offset=str(is_.last_stable), message=message)

    # -- replies --------------------------------------------------------------------------------

    def replies(self, *, idle_timeout: float | None = None) -> ReplyStream:
        """Every reply read from this agent's reply topic from now on: ``for r in writ.replies()`` or ``async for``.

        Ends when the client closes, when :meth:`ReplyStream.close` is called,
        or after ``idle_timeout`` seconds without a reply.
        """
        return ReplyStream(self, idle_timeout)


def _seconds(name: str, value: Any) -> float:
    """A timeout setting: a finite number of seconds > 0 (that threading can wait for); ValueError naming the field otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 < value <= threading.TIMEOUT_MAX:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _refusal(what: str, value: Any, err: CanonicalJsonError) -> CanonicalJsonError:
    """The error raised for an intent (or resolution) with no canonical JSON, naming where; ``what``: ``intent <id>``."""
    where = _first_uncanonical(value) if err.code == "not_canonical" else None
    return CanonicalJsonError(
        err.code,
        f"{what} not sent: {f'{where}: ' if where else ''}{err}; owners refuse it (rejected: {err.code})",
    )


def _pointer_token(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _first_uncanonical(value: Any, path: str = "") -> str | None:
    """The JSON pointer of the first key or value with no canonical JSON (for the error message), or None."""
    if isinstance(value, Mapping):
        for key, child in value.items():
            here = f"{path}/{_pointer_token(str(key))}"
            try:
                canonical_json(key)
            except CanonicalJsonError:
                return f"the key at {here!a}"
            found = _first_uncanonical(child, here)
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, child in enumerate(value):
            found = _first_uncanonical(child, f"{path}/{i}")
            if found is not None:
                return found
        return None
    try:
        canonical_json(value)
    except CanonicalJsonError:
        return f"the value at {path or '/'!a}"
    return None


class ReplyStream(Iterator[Any], AsyncIterator[Any]):
    """Replies as they arrive; registered when created, so nothing read after creation is missed.

    Holds at most :data:`MAX_UNREAD_REPLIES` unread (the oldest are dropped, with a warning); one its
    caller dropped without :meth:`close` stops listening once it is collected.
    """

    def __init__(self, client: WritClient, idle_timeout: float | None) -> None:
        self._client = client
        self._idle_timeout = idle_timeout
        self._queue: queue.Queue[Reply] = queue.Queue()
        self._dropped = 0
        self._closed = False
        self._last = time.monotonic()
        # Held weakly by the client: a stream its caller dropped without close() stops listening once collected.
        offer = weakref.WeakMethod(self._offer)
        listeners, lock = client._listeners, client._lock

        def listener(reply: Reply) -> None:
            method = offer()
            if method is None:
                with lock:
                    listeners.discard(listener)
            else:
                method(reply)

        self._listener = listener
        with client._lock:
            listeners.add(listener)

    def _offer(self, reply: Reply) -> None:
        """Queues a reply (on the reply thread): a reader that stopped reading costs at most MAX_UNREAD_REPLIES, the oldest dropped."""
        self._queue.put(reply)
        while self._queue.qsize() > MAX_UNREAD_REPLIES:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            if self._dropped % MAX_UNREAD_REPLIES == 0:
                _log.warning("replies() reader is not keeping up; oldest unread replies dropped (%d so far, %d kept)", self._dropped + 1, MAX_UNREAD_REPLIES)
            self._dropped += 1

    def close(self) -> None:
        self._closed = True
        with self._client._lock:
            self._client._listeners.discard(self._listener)

    def __enter__(self) -> ReplyStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _done(self) -> bool:
        if self._closed or self._client._closed:
            return True
        return self._idle_timeout is not None and time.monotonic() - self._last > self._idle_timeout

    def __iter__(self) -> ReplyStream:
        return self

    def __next__(self) -> Reply:
        while True:
            try:
                reply = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._done():
                    self.close()
                    raise StopIteration from None
                continue
            self._last = time.monotonic()
            return reply

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> Reply:
        while True:
            try:
                reply = self._queue.get_nowait()
            except queue.Empty:
                if self._done():
                    self.close()
                    raise StopAsyncIteration from None
                await asyncio.sleep(0.02)
                continue
            self._last = time.monotonic()
            return reply
