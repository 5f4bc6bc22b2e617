"""Escalations from Python: read the cases on ``writ.human``, and send an operator's decision on one.

The decision is a ``Resolution`` (``schemas/Resolution.json``), as TypeScript's ``client.resolve`` and
``writ escalations resolve`` send it: on the intents topic with the header ``writ-kind: resolution``, keyed by
the escalated intent's entity key, framed under the subject ``<intents topic>-Resolution`` when framing, signed
by the operator like an intent. The record's owner carries it out (wire contract §5.5, architecture §8) and
answers the operator under the resolution's id; the agent hears the outcome on its own reply topic.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .canonical import utf16_length
from .codec import DecodeError, WireCodec
from .models import EntityRef, Escalation, JsonPatchOp, iso_now, iso_time_micros

__all__ = [
    "KIND_HEADER",
    "RESOLUTION_FIELDS_BYTES",
    "Decision",
    "EscalationRecord",
    "LedgerIntentEntry",
    "LedgerOutcome",
    "build_resolution",
    "is_open",
    "latest_ledger_entries",
    "read_escalations",
    "resolution_bounds",
    "resolution_subject",
    "ResolutionBounds",
]

#: The header that tells owners a record of the intents topic is a resolution, not an intent.
KIND_HEADER = "writ-kind"

Decision = Literal["apply", "discard", "return"]
_DECISIONS = ("apply", "discard", "return")
#: What the schema allows (``schemas/Resolution.json``): the message in UTF-16 code units, as JavaScript counts them.
_MAX_MESSAGE = 2000
_MAX_VERSION = 256
_MAX_DELTA_OPS = 256
_DELTA = TypeAdapter(list[JsonPatchOp])
_log = logging.getLogger("writ_client")

#: The nesting a record read here may have, as the CLI's reads of a topic allow (``writ tail``, ``writ escalations``,
#: the ledger lookup of ``writ undo``; TypeScript's ``RECORD_MAX_DEPTH``): deeper records are skipped with a warning,
#: the same ones on both sides. The deepest an owner writes: a record's state (256 levels) two levels down in an
#: escalation, an intent (``WRIT_MAX_JSON_DEPTH``, at most 128) one level down.
CLI_MAX_DEPTH = 512

#: Bytes a resolution may take beside its intent and its delta (TypeScript's ``RESOLUTION_FIELDS_BYTES``): its ids,
#: base version, message, reply topic, record, time, member names and the registry's framing, escaped at worst.
RESOLUTION_FIELDS_BYTES = 20 * 1024


@dataclass(frozen=True)
class ResolutionBounds:
    """What owners admit of a resolution (TypeScript's ``resolutionBounds``, docs/wire-contract.md §3): the whole
    record's encoded bytes and nesting, and its ``delta``'s compact JSON bytes and nesting."""

    max_bytes: int
    max_depth: int
    delta_max_bytes: int
    delta_max_depth: int


def resolution_bounds(max_intent_bytes: int, max_json_depth: int) -> ResolutionBounds:
    """The bounds of a resolution for owners admitting intents of ``max_intent_bytes`` and ``max_json_depth``: it
    carries the escalated intent whole one level down, and may carry a change as large and as deep as an intent's."""
    return ResolutionBounds(
        max_bytes=2 * max_intent_bytes + RESOLUTION_FIELDS_BYTES,
        max_depth=max_json_depth + 1,
        delta_max_bytes=max_intent_bytes,
        delta_max_depth=max_json_depth - 1,
    )


def resolution_subject(intents_topic: str) -> str:
    """The registry subject of a resolution's schema: it shares the intents topic with intents (TypeScript's ``resolutionSubject``)."""
    return f"{intents_topic}-Resolution"


def build_resolution(
    escalation: Escalation | Mapping[str, Any],
    decision: Decision,
    *,
    operator: str,
    reply_to: str,
    base_version: str | None = None,
    delta: Sequence[JsonPatchOp | Mapping[str, Any]] | None = None,
    message: str | None = None,
    audience: str | None = None,
) -> dict[str, Any]:
    """The resolution's JSON object as it goes on the wire (what the operator's signature covers).

    ``apply`` writes the escalated intent on the record as it is at ``base_version`` (default: the version the
    escalation showed; a record changed since is ``resolution_conflict``, nothing written), with ``delta`` when
    given (else the owner rebuilds the tool's change from the intent's params); ``discard`` writes nothing;
    ``return`` hands it back to the agent. ``message`` goes to the agent. ``audience``: the deployment the operator
    signs it for (the owners' ``WRIT_SIGNING_AUDIENCE``), 1 to 128 of ``A-Z a-z 0-9 . _ : / -``.
    """
    e = escalation if isinstance(escalation, Escalation) else Escalation.model_validate(escalation)
    if decision not in _DECISIONS:
        raise ValueError(f'decision must be "apply", "discard" or "return", got {decision!r:.40}')
    version = base_version if base_version is not None else (e.current.version if e.current is not None else None)
    if base_version is not None and not (isinstance(base_version, str) and 0 < len(base_version) <= _MAX_VERSION):
        raise ValueError(f"base_version must be an ETag of 1 to {_MAX_VERSION} characters")
    if message is not None and not (isinstance(message, str) and utf16_length(message) <= _MAX_MESSAGE):
        raise ValueError(f"message must be a string of at most {_MAX_MESSAGE} characters")
    ops: list[dict[str, Any]] | None = None
    if delta is not None:
        if len(delta) > _MAX_DELTA_OPS:
            raise ValueError(f"delta has {len(delta)} operations, over the {_MAX_DELTA_OPS} owners take")
        ops = _DELTA.dump_python(_DELTA.validate_python(list(delta)), by_alias=True)
    resolution: dict[str, Any] = {
        "kind": "resolution",
        "resolutionId": str(uuid.uuid4()),
        "escalationId": e.escalation_id,
        # As writ.human carries it: the owner checks it against the entry it escalated.
        "intent": e.intent,
        "decision": decision,
    }
    if decision == "apply" and version is not None:
        resolution["baseVersion"] = version
    if ops is not None:
        resolution["delta"] = ops
    if message:
        resolution["message"] = message
    # The record's type and id only: what else the intent's entity carries is in the intent already.
    entity = e.intent["entity"]
    resolution.update({"operator": {"id": operator}, "replyTo": reply_to, "entity": {"type": entity["type"], "id": entity["id"]}, "createdAt": iso_now()})
    if audience is not None:
        if not (isinstance(audience, str) and re.fullmatch(r"[A-Za-z0-9._:/-]{1,128}", audience)):
            raise ValueError("audience must be 1–128 of A-Z a-z 0-9 . _ : / -")
        resolution["audience"] = audience
    return resolution


@dataclass(frozen=True)
class EscalationRecord:
    """An escalation and where it was read."""

    escalation: Escalation
    topic: str
    partition: int
    offset: int


def read_escalations(
    conf: Mapping[str, Any],
    codec: WireCodec,
    topic: str,
    *,
    timeout: float = 30.0,
    max_depth: int = CLI_MAX_DEPTH,
    open_only: bool = False,
    ledger_topic: str = "writ.ledger",
) -> list[EscalationRecord]:
    """Every escalation on ``topic``, oldest first, read (committed records only) from the beginning to the end
    each partition had when reached; records that do not decode or validate are skipped with a warning.

    ``open_only``: only the cases an owner would still take a decision on (``writ escalations list --open``),
    by the owners' ledger on ``ledger_topic``, read from its start to its end (which needs read access to it): the
    escalated intent's latest entry is done with an escalated outcome of that escalation id. A decided case, one
    re-submitted and escalated again, or one past the ledger's retention is not open.

    ``conf`` is the client's connection settings. Raises ``TimeoutError`` when a topic's end is not reached in
    ``timeout`` seconds (with what was read in the message: which cases are open is then not known, never
    guessed), ``KafkaException`` when a topic does not exist, ``RegistryError`` when a framed record's schema id
    cannot be checked with the registry.
    """
    deadline = time.monotonic() + timeout
    found: list[EscalationRecord] = []

    def take(partition: int, offset: int, key: bytes | None, data: bytes | None) -> None:
        if data is None:
            return
        try:
            value = codec.decode(data, max_depth=max_depth)
            found.append(EscalationRecord(Escalation.model_validate(value), topic, partition, offset))
        except (DecodeError, ValidationError) as bad:
            # A record that is not an escalation is reported and passed over; a registry that cannot be asked
            # (RegistryError) stops the read instead: skipping would hide a real escalation.
            _log.warning("%s-%d@%d skipped: %s", topic, partition, offset, str(bad)[:300])

    _read_to_end(conf, topic, deadline, timeout, take, what="escalations")
    if open_only:
        latest = latest_ledger_entries(conf, codec, ledger_topic, {r.escalation.intent_key for r in found}, timeout=max(0.0, deadline - time.monotonic()), max_depth=max_depth)
        found = [r for r in found if is_open(r.escalation, latest.get(r.escalation.intent_key))]
    # By the time each case was escalated (TypeScript sorts by Date.parse): `at` strings with different offsets
    # or fraction lengths do not sort as text.
    found.sort(key=lambda r: (iso_time_micros(r.escalation.at), r.partition, r.offset))
    return found


class LedgerOutcome(BaseModel):
    """What an intent's ledger entry says its outcome was: the fields a reader outside the owner needs."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    status: str = Field(max_length=64)
    escalation_id: str | None = Field(default=None, alias="escalationId", max_length=256)


class LedgerIntentEntry(BaseModel):
    """An intent's entry on the owners' ledger (``schemas/LedgerEntry.json``, ``kind: "intent"``), as far as a
    reader outside the owner needs it: ``pending`` before the system of record is called, ``done`` with an
    outcome after. The other fields are the owner's and are not kept."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    kind: Literal["intent"]
    status: Literal["pending", "conflicted", "done"]
    outcome: LedgerOutcome | None = None
    #: The intent's record and tool (what an undo of it names).
    entity: EntityRef | None = None
    tool: str | None = Field(default=None, min_length=1, max_length=128)


def is_open(escalation: Escalation, entry: LedgerIntentEntry | None) -> bool:
    """Whether an owner would still take a decision on ``escalation`` (TypeScript's ``isOpen``, architecture §8): the
    intent's latest ledger entry is done with an escalated outcome of this escalation id."""
    return (
        entry is not None
        and entry.status == "done"
        and entry.outcome is not None
        and entry.outcome.status == "escalated"
        and entry.outcome.escalation_id == escalation.escalation_id
    )


def latest_ledger_entries(
    conf: Mapping[str, Any], codec: WireCodec, topic: str, keys: set[str], *, timeout: float = 30.0, max_depth: int = CLI_MAX_DEPTH
) -> dict[str, LedgerIntentEntry | None]:
    """Each intent key's latest entry on the ledger ``topic`` (compacted, keyed by intent key), read from its start
    to the end it has now: ``None`` when the key is not there or its last record is a tombstone. Only records of
    ``keys`` are decoded; one that does not decode is reported and passed over. The whole topic is read: slow on a
    large ledger. Raises ``TimeoutError`` when its end is not reached in ``timeout`` seconds."""
    latest: dict[str, LedgerIntentEntry | None] = dict.fromkeys(keys)
    if not keys:
        return latest
    wanted = {k.encode("utf-8"): k for k in keys}

    def take(partition: int, offset: int, key: bytes | None, data: bytes | None) -> None:
        name = wanted.get(key) if key is not None else None
        if name is None:
            return
        if data is None:
            latest[name] = None
            return
        try:
            value = codec.decode(data, max_depth=max_depth)
        except DecodeError as bad:
            _log.warning("the ledger entry of %s… at %s-%d@%d cannot be read: %s", name[:12], topic, partition, offset, str(bad)[:300])
            return
        if not isinstance(value, dict) or value.get("kind") != "intent":
            return
        try:
            latest[name] = LedgerIntentEntry.model_validate(value)
        except ValidationError as bad:
            _log.warning("the ledger entry of %s… at %s-%d@%d cannot be read: %s", name[:12], topic, partition, offset, str(bad)[:300])

    _read_to_end(conf, topic, time.monotonic() + timeout, timeout, take, what="ledger entries")
    return latest


def _read_to_end(
    conf: Mapping[str, Any], topic: str, deadline: float, timeout: float, take: Callable[[int, int, bytes | None, bytes | None], None], *, what: str
) -> None:
    """Reads ``topic``'s committed records from the beginning to the end each partition has when reached, in a
    consumer of its own (no group offsets committed), and gives each record but control records to ``take``."""
    from .client import CONTROL_HEADER

    consumer = Consumer(
        {
            **conf,
            "group.id": f"writ.client.reader.{uuid.uuid4()}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            # A read position that falls below the log start meanwhile (retention, DeleteRecords) restarts at the
            # earliest record still there; librdkafka's default, the end, would report the read complete.
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
        }
    )
    count = 0
    try:
        metadata = consumer.list_topics(topic, timeout=max(0.1, deadline - time.monotonic()))
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            err = described.error if described is not None else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            raise KafkaException(err)
        pending = set(described.partitions)
        # OFFSET_BEGINNING: -2. Each partition reports EOF once it reaches its read_committed end.
        consumer.assign([TopicPartition(topic, p, -2) for p in sorted(pending)])
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{topic}: partitions {sorted(pending)} not read to their end in {timeout:g} s ({count} records read for {what})")
            msg = consumer.poll(min(left, 1.0))
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                if err.fatal() or not err.retriable():
                    raise KafkaException(err)
                continue
            if any(h[0] == CONTROL_HEADER for h in msg.headers() or []):
                continue
            count += 1
            take(msg.partition() or 0, msg.offset() or 0, msg.key(), msg.value())
    finally:
        consumer.close()
