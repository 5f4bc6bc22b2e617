"""What every agent-framework adapter shares (TypeScript's ``producers/adapters/tool-bridge.ts`` and
``intent-bases.ts``): how a tool call becomes a write intent, the base version it is sent against, and the
shape of the answer the model reads. No framework is imported here; :mod:`writ_client.pydantic_ai` and
:mod:`writ_client.langgraph` build on it.

- The **key** is built from the agent id, the run id (the conversation or thread), a step id
  (:data:`DEFAULT_STEP_ID` unless the harness gives one), the tool, the record and the intent fields; never the
  tool-call id. A retry, a resume or a re-plan under a new tool-call id is the same intent, answered from the
  owner's ledger (``duplicate: true``).
- The **base version** is the one the run has read (a read tool, an earlier write's answer, a conflict's
  ``current``), never one the model wrote; a call that needs approval pins it before it asks, so every resume is
  the same attempt against the version the approver saw. A conflict moves the pin for the calls made after it (a
  new tool-call id: the agent deciding again); a call keeps the base it was first pinned at, by its tool-call id, so
  a replay of the conflicting call itself (continued again from the same saved messages or checkpoint) meets the
  same conflict, answered from the ledger, instead of writing a change its approver saw on the older version.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, Union

from confluent_kafka import KafkaError, KafkaException
from pydantic import BaseModel, ValidationError

from .canonical import CanonicalJsonError, utf16_length
from .client import IntentInput, IntentRefused, WritClient
from .keys import KeyedTool
from .models import MAX_RUN_ID_LENGTH, AppliedReply, ConflictReply, EntityRef, EscalatedReply, JsonPatchOp, RejectedReply, SubmitResult, Versioned

__all__ = [
    "DEFAULT_STEP_ID",
    "MAX_RUN_ID_LENGTH",
    "RunIdInvalid",
    "REFUSED_FOR_NOW",
    "Reader",
    "WritDeps",
    "WritToolSpec",
    "check_run_ids",
    "invalid_params",
    "params_dict",
    "pin_base",
    "pin_call_base",
    "read_result",
    "read_with",
    "recall_versions",
    "refused_before_sending",
    "step_or_default",
    "submit_tool_call",
    "to_model_result",
]

#: The step id used when the harness gives none: one write per run, tool, target and intent fields.
DEFAULT_STEP_ID = "once-per-run"


class RunIdInvalid(ValueError):
    """The harness's run or step id is not one an intent can carry (TypeScript's ``config_invalid`` from
    ``checkRunIds``). ``field`` names where it came from. Not a pydantic ``ValidationError``: the frameworks hand
    those to the model as its own arguments' fault, and the model cannot fix a harness's id."""

    code = "config_invalid"

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


def check_run_ids(run_id: Any, step_id: Any, *, run_name: str = "run_id", step_name: str = "step_id") -> None:
    """Raises :class:`RunIdInvalid` naming the field when the run or step id is not a string of 1 to
    :data:`MAX_RUN_ID_LENGTH` UTF-16 code units (TypeScript's ``checkRunIds``). Checked before anything is read or
    pinned under it: otherwise every write of such a run read the record, then failed at encoding, and a number
    (a database id) made a key the intent could not carry."""
    for name, value in ((run_name, run_id), (step_name, step_id)):
        if isinstance(value, str) and 1 <= utf16_length(value) <= MAX_RUN_ID_LENGTH:
            continue
        got = f"{utf16_length(value)} characters" if isinstance(value, str) else type(value).__name__
        raise RunIdInvalid(name, f"{name} must be a string of 1 to {MAX_RUN_ID_LENGTH} characters (it is {got}), as an intent carries it")


def step_or_default(own: Any, given: Any) -> Any:
    """The step id of a call: the step-id function's, else the harness's (``WritDeps.step_id``), else
    :data:`DEFAULT_STEP_ID`. Only None is "not set": a falsy test took a step 0 (or "") for none, so steps 0 and 1
    of one intent were one write and the default step (0 answered as a repeat of the call without one). Whatever
    is set goes to :func:`check_run_ids`, which refuses a non-string (a number: ``str()`` it) naming it."""
    if own is not None:
        return own
    return given if given is not None else DEFAULT_STEP_ID


def invalid_params(err: ValidationError) -> dict[str, Any]:
    """The model's result for arguments that do not match the tool's parameters (TypeScript's OpenAI Agents
    ``invalidInputAnswered``): ``rejected`` / ``invalid_params``, nothing sent, for the model to fix. The message names
    the fields and the rules, not the values (a model's argument may be megabytes)."""
    issues = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())) or '(arguments)'}: {e.get('msg', '')}" for e in err.errors(include_url=False, include_input=False))
    return {
        "status": "rejected",
        "reason": "invalid_params",
        "message": f"the arguments do not match the tool's parameters: {issues}"[:2000],
        "instruction": "The arguments do not match the tool's parameters and nothing was written. Fix them and call the tool again.",
    }


#: Refusals that end by themselves (TypeScript's ``REFUSED_FOR_NOW``): a record leased to a change that spans records
#: takes writes again once the change ends, so the same call later may write. Every other refusal holds for the same
#: arguments.
REFUSED_FOR_NOW = frozenset({"leased"})

P = TypeVar("P", bound=BaseModel)
Reader = Callable[[EntityRef], Union[Versioned, Mapping[str, Any], Awaitable[Union[Versioned, Mapping[str, Any]]]]]


@dataclass
class WritToolSpec(Generic[P]):
    """How a tool call becomes a write intent: the declaration, the params model, the record, the delta."""

    tool: KeyedTool
    #: The model-facing params (a pydantic model); the owner validates the ones it declares and ignores the rest.
    params: type[P]
    #: The record a call targets, from the model's params.
    entity: Callable[[P], EntityRef]
    #: The RFC 6902 delta for these params against ``current`` (the version the harness carries).
    delta: Callable[[P, Versioned], list[JsonPatchOp] | list[dict[str, Any]]]
    #: Shown to the model; defaults to the declaration's.
    description: str | None = None


@dataclass
class WritDeps:
    """What writ needs from the harness for a run (Pydantic AI: its ``deps``, or ``deps.writ``; LangGraph: the tools'
    context, or a function of the call that returns one).

    ``versions`` (entity key → record) and ``bases`` (intent key → the base a
    call was first sent against, with the bases its latest tool calls were
    sent against: see :func:`pin_base`) are plain JSON: keep them with the
    run's saved state if you resume in another process. Empty is fine too: the
    adapters find the versions the run has read in its own history, and the
    owner's ledger answers a repeat whatever base it carries.
    """

    client: WritClient
    #: Reads a record with its version when the run has not read it yet.
    read: Reader | None = None
    #: The run (conversation) id; default: the framework's (Pydantic AI's ``conversation_id``, LangGraph's ``thread_id``).
    run_id: str | None = None
    #: A step id, only when the same intent may legitimately happen twice in one run.
    step_id: str | None = None
    #: Deadline of one submission, seconds; past it the tool answers ``unknown``. Default: the client's.
    timeout: float | None = None
    versions: dict[str, dict[str, Any]] = field(default_factory=dict)
    bases: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Fill ``versions`` from the tool results in the conversation (:func:`recall_versions`). Only for a conversation
    #: whose messages the server's own code wrote: a write is based on those results (its base version, and the state
    #: its delta is built from), so one that takes messages from a browser (a LangGraph server's thread input, a chat
    #: UI that posts the history) could carry a forged read result. Set it to False there, and keep ``versions`` on
    #: the server per run, or leave it empty so each write reads the record.
    recall_from_messages: bool = True

    def remember(self, entity: EntityRef, record: Versioned) -> None:
        self.versions[entity.key] = {"state": record.state, "version": record.version}

    def known(self, entity: EntityRef) -> Versioned | None:
        rec = self.versions.get(entity.key)
        return Versioned.model_validate(rec) if rec else None


async def read_with(reader: Reader | None, entity: EntityRef) -> Versioned:
    """The record with its version, from the harness's reader (sync or async)."""
    if reader is None:
        raise TypeError("writ tools need a way to read records: WritDeps(read=...) or the tool's read=")
    got = reader(entity)
    if inspect.isawaitable(got):
        got = await got
    return got if isinstance(got, Versioned) else Versioned.model_validate(got)


def read_result(entity: EntityRef, record: Versioned) -> dict[str, Any]:
    """What a read tool answers: the record, its version, and that writes are checked against it."""
    return {
        "status": "read",
        "entity": entity.model_dump(),
        "record": record.state,
        "version": record.version,
        "instruction": "This is the record as it is now. Your writes to it are checked against this version.",
    }


def to_model_result(result: SubmitResult) -> dict[str, Any]:
    """A reply in the shape a model can act on (TypeScript's ``toModelResult``): what happened and what to do next."""
    if isinstance(result, AppliedReply):
        applied: dict[str, Any] = {"status": "applied", "duplicate": result.duplicate, "record": result.state, "version": result.version}
        if result.truncated:
            # Carried so that a run continued from saved messages does not take this null for the record (recall_versions).
            applied["truncated"] = True
        applied["instruction"] = (
            "This write had already been applied; nothing was written again. Do not call the tool again for it."
            if result.duplicate
            else "The write was applied. Do not call the tool again for it."
        )
        return applied
    if isinstance(result, ConflictReply):
        conflict: dict[str, Any] = {
            "status": "conflict",
            "cycle": result.cycle,
            "current": result.current.model_dump(mode="json", by_alias=True),
            "your_change": [op.model_dump(mode="json", by_alias=True) for op in result.your_change],
        }
        if result.truncated:
            conflict["truncated"] = True
        conflict["instruction"] = (
            "The record changed since it was read; your change was NOT applied. Look at `current` and decide again: "
            "call the tool again only if the change is still right for the current record."
            + (" `current.state` was too large to include: read the record again before deciding." if result.truncated else "")
        )
        return conflict
    if isinstance(result, RejectedReply):
        return {
            "status": "rejected",
            "reason": result.reason,
            "message": result.message,
            "instruction": "The write was refused for now and nothing was written: the record is held by another change (the message says "
            "until when at the latest). Call the tool again later with the same arguments."
            if result.reason in REFUSED_FOR_NOW
            else KEY_REUSED_INSTRUCTION
            if result.reason == KEY_REUSED
            else "The write was refused and nothing was written. Do not retry it unchanged.",
        }
    if isinstance(result, EscalatedReply):
        return {"status": "escalated", "reason": result.reason, "instruction": "A person will handle this write. Tell the user it is with a human; do not retry."}
    # unknown, and blocked (which is unknown with a visible reason). Safe only in the same run: the run id is part of
    # the intent key, and a new run makes the same call a new intent that could write twice.
    return {
        "status": "unknown",
        "instruction": "No answer yet: the write may or may not have happened. Do not assume it failed and do not retry with new ids. "
        "In this same run (this conversation or thread), calling the same tool with the same arguments again is safe and asks for "
        "the outcome; from a new run it may count as a new write, so read the record first.",
    }


#: The owner's refusal of a call whose intent key (run, tool, record, intent fields) an earlier call with other arguments
#: holds: this call wrote nothing, but the earlier one may have been applied. Told "nothing was written", a model takes the
#: earlier write for refused too, and may make it again under changed intent fields (a new key: a second write).
KEY_REUSED = "key_reused_with_different_params"
KEY_REUSED_INSTRUCTION = (
    "This call was not written: an earlier call of this tool on this record, for the same intent, was made in this run with other "
    "arguments, and that earlier write may have been applied. Do not assume it failed: read the record before deciding; calling again "
    "with the earlier call's arguments returns its outcome."
)


def refused_before_sending(err: BaseException) -> dict[str, Any] | None:
    """The model's result for an error with which the client refused an intent for good before sending it (TypeScript's
    ``modelResultOf``): ``rejected`` with ``too_large``, ``too_deep`` or ``not_canonical``, telling the model to change
    the arguments, since the same ones fail the same way. ``None`` for any other error, which the caller raises: an
    error that leaves the outcome open (Kafka unreachable) must end the run, not read as a refusal."""
    reason: str | None = None
    if isinstance(err, IntentRefused):
        reason = err.code
    elif isinstance(err, CanonicalJsonError) and err.code in ("not_canonical", "input_too_deep"):
        reason = "too_deep" if err.code == "input_too_deep" else err.code
    elif isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError) and err.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
        # The client's own check against the producer's message.max.bytes, made before anything is sent.
        reason = "too_large"
    if reason is None:
        return None
    return {
        "status": "rejected",
        "reason": reason,
        "message": str(err.args[0].str() if isinstance(err, KafkaException) else err)[:2000],
        "instruction": "The write was refused before it was sent and nothing was written. Calling the tool again with the same "
        "arguments fails the same way: change them, or tell the user.",
    }


def recall_versions(deps: WritDeps, outputs: Iterable[Any]) -> None:
    """Fills ``deps.versions``, for records it does not know yet, from tool results already in the conversation (oldest first).

    Read results and write results that carry their ``entity`` (``applied``:
    the new version; ``conflict``: ``current``). A run continued from saved
    messages in a fresh process then bases its writes on what the model saw.
    Nothing, with ``deps.recall_from_messages`` False (messages a client may have forged).
    """
    if not deps.recall_from_messages:
        return
    latest: dict[str, tuple[EntityRef, Versioned]] = {}
    for out in outputs:
        if not isinstance(out, Mapping):
            continue
        ent = out.get("entity")
        if not isinstance(ent, Mapping) or not isinstance(ent.get("type"), str) or not isinstance(ent.get("id"), str):
            continue
        record: Versioned | None = None
        current = out.get("current")
        # A version without its record (a repeat, a reply too large to carry it) would pair the version with no state:
        # a write based on it would build its delta from nothing. A null record says it too, for outputs saved before
        # `truncated` was carried (TypeScript's recallVersions).
        stateless = (
            out.get("truncated") is True
            or (out.get("status") == "applied" and (out.get("duplicate") is True or out.get("record") is None))
            or (out.get("status") == "conflict" and isinstance(current, Mapping) and current.get("state") is None)
        )
        if stateless:
            continue
        if out.get("status") in ("read", "applied") and isinstance(out.get("version"), str):
            record = Versioned(state=out.get("record"), version=out["version"])
        elif out.get("status") == "conflict" and isinstance(current, Mapping) and isinstance(current.get("version"), str):
            record = Versioned(state=current.get("state"), version=current["version"])
        if record is not None:
            entity = EntityRef(type=ent["type"], id=ent["id"])
            latest[entity.key] = (entity, record)
    for entity, record in latest.values():
        if deps.known(entity) is None:
            deps.remember(entity, record)


def params_dict(spec: WritToolSpec[Any], params: BaseModel) -> dict[str, Any]:
    """The params as they go on the wire and into the key: JSON values; a None the model left out is absent, as in
    TypeScript (except an intent field)."""
    dumped = params.model_dump(mode="json", by_alias=True)
    return {k: v for k, v in dumped.items() if v is not None or k in spec.tool.intent_fields}


#: How many tool-call ids (the latest) an intent's pin remembers the bases of.
REMEMBERED_CALLS = 8


async def pin_base(deps: WritDeps, key: str, entity: EntityRef, read: Reader | None, tool_call_id: str | None = None) -> Versioned:
    """The base intent ``key`` is sent against by the call ``tool_call_id``: the one that call was pinned at, else the
    one pinned for the key, else the version the run knows, else a read (remembered); pinned from then on, so a resume
    or a replay of the call sends the same attempt.

    ``deps.bases[key]`` (plain JSON, TypeScript's ``IntentPin``): ``state`` and ``version``, the base a call under a
    new tool-call id gets; ``calls``, the ids pinned at it; ``earlier``, ``[{"base", "calls"}]`` for the calls pinned
    at bases a conflict moved the pin from; the latest :data:`REMEMBERED_CALLS` ids in all. A bare
    ``{"state", "version"}`` (as stored before) remembers no call. Without a tool-call id a call gets the pin as it is.
    """
    pinned = deps.bases.get(key)
    if pinned:
        if tool_call_id:
            remembered = _remembered_base(pinned, tool_call_id)
            if remembered is not None:
                return Versioned.model_validate(remembered)
            deps.bases[key] = _with_call(pinned, tool_call_id)
        return Versioned.model_validate(_bare(pinned))
    base = deps.known(entity)
    if base is None:
        base = await read_with(read or deps.read, entity)
        deps.remember(entity, base)
    pin: dict[str, Any] = {"state": base.state, "version": base.version}
    deps.bases[key] = _with_call(pin, tool_call_id) if tool_call_id else pin
    return base


def pin_call_base(deps: WritDeps, key: str, tool_call_id: str | None, base: Mapping[str, Any]) -> None:
    """Pins ``base`` for the call ``tool_call_id`` unless the call is pinned already: the base carried with an approval
    (Pydantic AI's request metadata), which a harness in another process, or after the pin moved, has not kept."""
    pinned = deps.bases.get(key)
    bare = {"state": base.get("state"), "version": base.get("version")}
    if not pinned:
        deps.bases[key] = _with_call(bare, tool_call_id) if tool_call_id else bare
    elif tool_call_id and _remembered_base(pinned, tool_call_id) is None:
        if pinned.get("version") == bare["version"]:
            deps.bases[key] = _with_call(pinned, tool_call_id)
        else:
            deps.bases[key] = _latest_calls({**pinned, "earlier": [*pinned.get("earlier", []), {"base": bare, "calls": [tool_call_id]}]})


def _bare(pin: Mapping[str, Any]) -> dict[str, Any]:
    return {"state": pin.get("state"), "version": pin.get("version")}


def _remembered_base(pin: Mapping[str, Any], tool_call_id: str) -> dict[str, Any] | None:
    if tool_call_id in pin.get("calls", ()):
        return _bare(pin)
    for earlier in pin.get("earlier", ()):
        if tool_call_id in earlier.get("calls", ()):
            return dict(earlier["base"])
    return None


def _with_call(pin: Mapping[str, Any], tool_call_id: str) -> dict[str, Any]:
    return _latest_calls({**pin, "calls": [*pin.get("calls", []), tool_call_id]})


def _moved_pin(pin: Mapping[str, Any], to: Versioned) -> dict[str, Any]:
    """The pin moved to ``to`` (the agent deciding again): the calls pinned at its base keep that base."""
    earlier = [*pin.get("earlier", [])]
    if pin.get("calls"):
        earlier.append({"base": _bare(pin), "calls": list(pin["calls"])})
    moved: dict[str, Any] = {"state": to.state, "version": to.version}
    if earlier:
        moved["earlier"] = earlier
    return moved


def _latest_calls(pin: dict[str, Any]) -> dict[str, Any]:
    """The pin without the oldest calls past :data:`REMEMBERED_CALLS` (the earliest bases' first)."""
    excess = len(pin.get("calls", [])) + sum(len(e.get("calls", [])) for e in pin.get("earlier", [])) - REMEMBERED_CALLS
    if excess <= 0:
        return pin
    earlier = []
    for e in pin.get("earlier", []):
        dropped = min(excess, len(e["calls"]))
        excess -= dropped
        if dropped < len(e["calls"]):
            earlier.append({"base": e["base"], "calls": e["calls"][dropped:]})
    calls = pin.get("calls", [])[excess:]
    trimmed = _bare(pin)
    if calls:
        trimmed["calls"] = calls
    if earlier:
        trimmed["earlier"] = earlier
    return trimmed


async def submit_tool_call(
    deps: WritDeps,
    spec: WritToolSpec[Any],
    params: BaseModel,
    *,
    run_id: str,
    step_id: str,
    key: str,
    entity: EntityRef,
    tool_call_id: str | None,
    read: Reader | None,
) -> dict[str, Any]:
    """Submits the call against its pinned base and returns :func:`to_model_result`'s shape plus the ``entity``;
    the run's versions and the intent's base follow the answer (an applied write's new version; a conflict's
    ``current``, which the agent decides again from, or a fresh read when the reply left the record out). An
    intent the client refuses before sending it is a ``rejected`` result (:func:`refused_before_sending`)."""
    check_run_ids(run_id, step_id)
    base = await pin_base(deps, key, entity, read, tool_call_id)
    try:
        result = await deps.client.asubmit(
            IntentInput(
                tool=spec.tool,
                entity=entity,
                run_id=run_id,
                step_id=step_id,
                tool_call_id=tool_call_id,
                base_version=base.version,
                delta=spec.delta(params, base),  # type: ignore[arg-type]
                params=params_dict(spec, params),
            ),
            timeout=deps.timeout,
        )
    except Exception as err:
        refused = refused_before_sending(err)
        if refused is None:
            raise
        return {**refused, "entity": entity.model_dump()}
    # A repeat (or a truncated reply) carries the version without the record: remembering it would pair a version with no state.
    if isinstance(result, AppliedReply) and not result.duplicate and not result.truncated:
        deps.remember(entity, Versioned(state=result.state, version=result.version))
    if isinstance(result, ConflictReply):
        sent = {"state": base.state, "version": base.version}
        pinned = deps.bases.get(key) or (_with_call(sent, tool_call_id) if tool_call_id else sent)
        # Only a call sent against the pin moves it. One sent against a base the pin has moved from (a replay of a call
        # that met its conflict before) meets the ledger's old answer, which the pin has moved past already.
        if pinned.get("version") == base.version:
            await _move_pin(deps, key, pinned, result, entity, read)
    return {**to_model_result(result), "entity": entity.model_dump()}


async def _move_pin(deps: WritDeps, key: str, pinned: Mapping[str, Any], result: ConflictReply, entity: EntityRef, read: Reader | None) -> None:
    """After a conflict: calls under new tool-call ids (the agent deciding again) are sent against its ``current``."""
    if not result.truncated:
        deps.bases[key] = _moved_pin(pinned, result.current)
        deps.remember(entity, result.current)
        return
    # The conflict's record was too large for the reply: pinned, its version with no state would let the next
    # attempt build its delta from nothing at a matching version and drop what the record holds. The record is
    # read afresh instead; a read that fails leaves the old pin: the next attempt meets the same conflict, with
    # nothing written, and reads again.
    try:
        fresh = await read_with(read or deps.read, entity)
    except Exception:  # noqa: BLE001 - see above: the old pin is the safe state
        return
    deps.bases[key] = _moved_pin(pinned, fresh)
    deps.remember(entity, fresh)
