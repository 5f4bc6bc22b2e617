"""writ's wire values as pydantic models (the zod schemas of ``src/schemas/``).

Attributes are snake_case; the wire names (camelCase, and ``your_change``)
are the aliases: ``model_dump(by_alias=True)`` gives the wire shape, and
models validate from either. Replies accept fields they do not know
(``extra="allow"``), as the TypeScript schemas do.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_serializer, model_validator
from pydantic.alias_generators import to_camel

from .canonical import utf16_length

__all__ = [
    "AgentRef",
    "AppliedReply",
    "BlockedOutcome",
    "ConflictReply",
    "EntityRef",
    "EscalatedReply",
    "JsonPatchOp",
    "NoReplyReason",
    "RejectedReply",
    "Reply",
    "SubmitResult",
    "UnknownOutcome",
    "Versioned",
    "WriteIntent",
    "iso_now",
    "iso_time_micros",
    "parse_reply",
]

_POINTER = r"^(/([^~/]|~[01])*)*$"


def _utf16_at_most(limit: int) -> AfterValidator:
    """A string of at most ``limit`` UTF-16 code units: the length owners (zod, JavaScript) check, not code points."""

    def check(v: str) -> str:
        units = utf16_length(v)
        if units > limit:
            raise ValueError(f"at most {limit} UTF-16 code units (as owners count; a character beyond U+FFFF is two), got {units}")
        return v

    return AfterValidator(check)


def _text(limit: int) -> Any:
    """A non-empty string of at most ``limit`` UTF-16 code units."""
    return Annotated[str, Field(min_length=1), _utf16_at_most(limit)]


_Text128 = _text(128)

#: An ISO 8601 time as the owners' schemas accept it (zod's ``z.iso.datetime({ offset: true })``): a valid calendar
#: date, seconds, any fraction, ``Z`` or an offset of ±HH:MM.
_ISO_TIME = re.compile(
    r"(?:(?:\d\d[2468][048]|\d\d[13579][26]|\d\d0[48]|[02468][048]00|[13579][26]00)-02-29"
    r"|\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8])))"
    r"T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)",
    re.ASCII,
)


def iso_time_micros(value: str) -> int:
    """Microseconds since the epoch of an ISO time the owners accept (what JavaScript's ``Date.parse`` orders by;
    the fraction past microseconds is dropped). ``ValueError`` for any other string."""
    if not isinstance(value, str) or not _ISO_TIME.fullmatch(value):
        raise ValueError(f"not an ISO 8601 time with seconds and Z or an offset: {value!r:.80}")
    year, month, day = int(value[0:4]), int(value[5:7]), int(value[8:10])
    # Days from 1970-01-01 in the proleptic Gregorian calendar, year 0 included (as Date.parse reads it).
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    seconds = days * 86400 + int(value[11:13]) * 3600 + int(value[14:16]) * 60 + int(value[17:19])
    rest = value[19:]
    micros = 0
    if rest.startswith("."):
        digits = len(rest) - len(rest.lstrip(".0123456789")) - 1
        micros = int((rest[1 : 1 + digits] + "000000")[:6])
        rest = rest[1 + digits :]
    if rest != "Z":
        sign = 1 if rest[0] == "+" else -1
        seconds -= sign * (int(rest[1:3]) * 3600 + int(rest[4:6]) * 60)
    return seconds * 1_000_000 + micros


def _iso_time(v: str) -> str:
    iso_time_micros(v)
    return v


_IsoTime = Annotated[str, AfterValidator(_iso_time)]
_Text256 = _text(256)
#: The longest run or step id an intent carries (``agent.runId``, ``agent.stepId``), in UTF-16 code units as owners count.
MAX_RUN_ID_LENGTH = 256
_RunId = _text(MAX_RUN_ID_LENGTH)
_Text249 = _text(249)


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class EntityRef(_Wire):
    """A business entity; its Kafka key is ``<type>:<id>``."""

    type: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,63}$")
    id: _Text256

    @property
    def key(self) -> str:
        return f"{self.type}:{self.id}"


class Versioned(_Wire):
    """A record as read from its system of record: its state and its ETag (quotes included)."""

    state: Any = None
    version: _Text256


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(pattern=_POINTER)


class AddOp(_Op):
    op: Literal["add"]
    value: Any


class RemoveOp(_Op):
    op: Literal["remove"]


class ReplaceOp(_Op):
    op: Literal["replace"]
    value: Any


class MoveOp(_Op):
    op: Literal["move"]
    from_: str = Field(alias="from", pattern=_POINTER)
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class CopyOp(_Op):
    op: Literal["copy"]
    from_: str = Field(alias="from", pattern=_POINTER)
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TestOp(_Op):
    __test__ = False  # not a pytest class
    op: Literal["test"]
    value: Any


#: One RFC 6902 JSON Patch operation.
JsonPatchOp = Annotated[Union[AddOp, RemoveOp, ReplaceOp, MoveOp, CopyOp, TestOp], Field(discriminator="op")]


class AgentRef(_Wire):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    id: _Text128
    run_id: _RunId
    step_id: _RunId
    tool_call_id: _Text256 | None = None

    @model_serializer(mode="wrap")
    def _drop_unset_call_id(self, handler: Any) -> Any:
        data = handler(self)
        for name in ("toolCallId", "tool_call_id"):
            if name in data and data[name] is None:
                del data[name]
        return data


#: The base version of a create (the record must not exist), of an undo (the owner takes it from its ledger) and of
#: a lease intent (it writes nothing).
ABSENT_VERSION = "absent"
LEDGER_VERSION = "ledger"
LEASE_VERSION = "lease"

#: How long a lease lasts when its acquire names no ``ttl_ms``, and the longest an agent may ask for (ms).
DEFAULT_LEASE_TTL_MS = 60_000
MAX_LEASE_TTL_MS = 600_000


class IntentLease(_Wire):
    """On the intents of a change that spans records (wire contract §5.8): ``acquire`` takes the record's lease for
    the change, ``release`` gives it back, ``step`` marks a write (or an undo) made under it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    change: str = Field(pattern=r"^[0-9a-f]{64}$")
    op: Literal["acquire", "release", "step"]
    ttl_ms: int | None = Field(default=None, ge=1000, le=MAX_LEASE_TTL_MS)

    @model_serializer(mode="wrap")
    def _drop_unset_ttl(self, handler: Any) -> Any:
        data = handler(self)
        for name in ("ttlMs", "ttl_ms"):
            if name in data and data[name] is None:
                del data[name]
        return data


def _without_unset(model: BaseModel, fields: tuple[str, ...], dump: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``dump(**kwargs)`` with the optional ``fields`` that are None left out (unless the caller excludes otherwise)."""
    unset = {f for f in fields if getattr(model, f) is None}
    exclude = kwargs.get("exclude")
    if unset and exclude is None:
        kwargs["exclude"] = unset
    elif unset and isinstance(exclude, (set, frozenset)):
        kwargs["exclude"] = {*exclude, *unset}
    return dump(**kwargs)


class UndoRef(_Wire):
    """On an undo: the intent whose applied change it compensates."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    intent_key: str = Field(pattern=r"^[0-9a-f]{64}$")


class WriteIntent(_Wire):
    """What an agent's write tool publishes on ``writ.intents`` (key: the entity key)."""

    # NaN and ±Infinity stay floats in to_wire() (pydantic would write them as null): the client refuses them before sending.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", ser_json_inf_nan="constants")

    intent_id: _Text128
    intent_key: str = Field(pattern=r"^[0-9a-f]{64}$")
    entity: EntityRef
    tool: _Text128
    agent: AgentRef
    base_version: _Text256
    #: At least one operation, except on an undo (the owner derives the compensating change): none.
    delta: list[JsonPatchOp] = Field(max_length=256)
    params: dict[str, Any]
    reply_to: _Text249
    created_at: str
    #: Only on an undo (:meth:`WritClient.undo`).
    undo: UndoRef | None = None
    #: Only on the intents of a change that spans records (:meth:`WritClient.change`).
    lease: IntentLease | None = None
    #: The deployment the intent is signed for (the owners' ``WRIT_SIGNING_AUDIENCE``): the client's ``audience=``.
    audience: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._:/-]{1,128}$")

    @model_validator(mode="after")
    def _delta_unless_undo_or_lease(self) -> WriteIntent:
        lease_op = self.lease is not None and self.lease.op != "step"
        if (len(self.delta) == 0) != (self.undo is not None or lease_op):
            raise ValueError("the delta must have at least one operation (only an undo, a lease acquire or a lease release has none)")
        return self

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """As pydantic's, without ``undo``, ``lease`` and ``audience`` when they are not set (owners take no ``null`` there). Not a
        wrap serializer: that would turn the UnicodeEncodeError of a lone surrogate, which
        :meth:`WritClient.submit` handles, into a serialization error."""
        return _without_unset(self, ("undo", "lease", "audience"), super().model_dump, kwargs)

    @field_validator("created_at")
    @classmethod
    def _iso(cls, v: str) -> str:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})", v):
            raise ValueError("an ISO 8601 date-time with an offset, e.g. 2026-01-01T00:00:00.000Z")
        return v

    def to_wire(self) -> dict[str, Any]:
        """The JSON object that goes on the wire (camelCase); what the signature covers.

        NaN and ±Infinity are kept as floats (not turned into null), so that
        ``canonical_json`` refuses them (``not_canonical``), as owners would.
        """
        return self.model_dump(mode="json", by_alias=True)


class _ReplyBase(_Wire):
    intent_id: str
    intent_key: str
    #: True when this is the stored answer re-sent for a repeated submission.
    duplicate: bool
    at: str


class AppliedReply(_ReplyBase):
    status: Literal["applied"]
    entity: EntityRef
    #: The record after the write (None on a repeat, or when ``truncated``).
    state: Any = None
    version: str
    #: ``patch``, ``create`` or ``reconcile``.
    via: str
    truncated: bool | None = None
    #: The write tool, so that the write can be undone from its reply (:meth:`WritClient.undo`).
    tool: str | None = None
    #: On the reply to an undo: the key of the intent it compensated.
    undo_of: str | None = None
    #: On a repeat (``duplicate``) of a write an applied undo compensated since: that undo's intent key. The write
    #: is answered applied, as it was, but its effect no longer stands (a change compensated before).
    undone_by: str | None = None
    #: On the reply to a lease intent (``via == "lease"``): ``{"change", "expiresAt"}`` (with ``"heldBefore": True`` when
    #: the change held the record before: an earlier run), or ``{"change", "released": True}``.
    lease: dict[str, Any] | None = None
    #: When an operator's ``apply`` of an escalation wrote it (:meth:`WritClient.resolve`): the operator's id.
    resolved_by: str | None = None


class ConflictReply(_ReplyBase):
    status: Literal["conflict"]
    entity: EntityRef
    cycle: int = Field(ge=1)
    message: str
    current: Versioned
    your_change: list[JsonPatchOp] = Field(alias="your_change")
    truncated: bool | None = None


class RejectedReply(_ReplyBase):
    status: Literal["rejected"]
    #: Machine-readable: ``key_reused_with_different_params``, ``params_invalid``, ``intent_key_mismatch`` …
    reason: str
    message: str
    details: Any = None
    #: ``details`` was left out because the reply would exceed the broker's message size.
    truncated: bool | None = None


class EscalatedReply(_ReplyBase):
    status: Literal["escalated"]
    entity: EntityRef
    reason: str
    message: str
    escalation_id: str


class Escalation(_Wire):
    """A case for a human, as an owner writes it on ``writ.human`` (key: the entity key).

    ``intent`` is the escalated intent as the record carries it (the JSON object, camelCase), kept as read:
    a resolution sends it back unchanged, and the owner checks it against its ledger.
    """

    escalation_id: _Text128
    #: Machine-readable: ``conflict_cycles_exhausted``, ``outcome_unknown``, ``sor_protocol``, ``processing_failed``
    reason: str
    message: str
    intent: dict[str, Any]
    #: Conflict cycles seen for this intent key.
    cycles: int = Field(ge=0)
    #: The record as last read, when it could be read.
    current: Versioned | None
    #: When the owner escalated it (ISO 8601, as the owners' schema requires).
    at: _IsoTime
    #: The write may have reached the system of record: check the record before deciding (an ``apply`` reconciles first).
    may_have_written: bool | None = None
    #: ``current.state`` was left out because the escalation would exceed the broker's message size: read the record.
    truncated: bool | None = None

    @field_validator("intent")
    @classmethod
    def _intent(cls, v: dict[str, Any]) -> dict[str, Any]:
        key, entity, tool = v.get("intentKey"), v.get("entity"), v.get("tool")
        if not isinstance(key, str) or not re.fullmatch(r"[0-9a-f]{64}", key):
            raise ValueError("the escalated intent has no intentKey of 64 hex digits")
        EntityRef.model_validate(entity)
        if not isinstance(tool, str) or not 0 < len(tool) <= 128:
            raise ValueError("the escalated intent names no tool")
        return v

    @property
    def intent_key(self) -> str:
        """The escalated intent's key."""
        return str(self.intent["intentKey"])

    @property
    def entity(self) -> EntityRef:
        """The escalated intent's record."""
        return EntityRef.model_validate(self.intent["entity"])

    @property
    def tool(self) -> str:
        return str(self.intent["tool"])


#: The owner's answer on the agent's reply topic.
Reply = Annotated[Union[AppliedReply, ConflictReply, RejectedReply, EscalatedReply], Field(discriminator="status")]

_REPLY = TypeAdapter(Reply)


def parse_reply(value: Any) -> AppliedReply | ConflictReply | RejectedReply | EscalatedReply:
    """Validates a decoded reply (raises ``pydantic.ValidationError``)."""
    return _REPLY.validate_python(value)


#: Why a waiting submit can get no reply any more (TypeScript's ``NoReplyReason``).
NoReplyReason = Literal["reply_consumer_stopped", "client_closed"]


class UnknownOutcome(_Wire):
    """No reply before the deadline: the write may or may not have happened. Submitting the same intent again asks again."""

    status: Literal["unknown"] = "unknown"
    intent_id: str
    intent_key: str
    message: str
    #: Why no reply can come, when it is known (TypeScript's ``NoReplyReason``): ``client_closed``, the client was closed
    #: while the submit waited; ``reply_consumer_stopped``, the client's reply consumer stopped for good while it
    #: waited. This client gives only ``client_closed`` (its reply consumer keeps trying); an outcome of the
    #: TypeScript client, relayed as JSON, parses with either.
    reason: NoReplyReason | None = None


class BlockedOutcome(_Wire):
    """No reply before the deadline because the reply partition is held by an open transaction.

    Its read_committed end (last stable offset) stayed at ``offset`` for the
    whole wait, behind its high watermark. The write may or may not have
    happened, as with ``unknown``.
    """

    status: Literal["blocked"] = "blocked"
    intent_id: str
    intent_key: str
    topic: str
    partition: int
    offset: str
    message: str


SubmitResult = Union[AppliedReply, ConflictReply, RejectedReply, EscalatedReply, UnknownOutcome, BlockedOutcome]


def iso_now() -> str:
    """Now as JavaScript's ``toISOString()`` writes it: ``2026-01-01T00:00:00.000Z``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
