"""Pydantic AI adapter: writ write tools as Pydantic AI tools (``pip install writ-client[pydantic-ai]``).

A write tool's call becomes a write intent. The model supplies the params;
the harness supplies the run id (the conversation id), and the adapter the
base version, from what the run has read (never the model).

The key is built as the TypeScript adapters build it (``producers/adapters/``):
``intent_key(tool, agent, run id, step id, entity, params)`` with the step id
``"once-per-run"`` unless the harness gives one, so a retry, a resume from
saved messages or a re-plan under a new tool-call id is the same intent, and
the owner answers it from its ledger (``duplicate: true``) instead of writing
again.

**Approval** uses Pydantic AI's deferred tools: with ``requires_approval`` the
tool raises ``ApprovalRequired`` on an unapproved call, so the run ends with a
``DeferredToolRequests`` output; approve it with :func:`approval_results` and
run again with ``message_history=`` and ``deferred_tool_results=``. Before the
run stops, the adapter reads the record and pins the base version the approver
saw in the request's metadata (``DeferredToolRequests.metadata``); keep the
requests with the saved messages. Every resume from that saved state, also a
second one from the same older state, is then the same attempt against the
same base (as the TypeScript adapters pin it in ``intent-bases.ts``).
(``Tool(requires_approval=True)`` would defer the call before any code of the
tool runs, so nothing could be pinned: hence ``ApprovalRequired``.)

Example::

    refund = writ_tool(refund_spec, requires_approval=True)
    agent = Agent(model, tools=[refund, writ_read_tool(["payment"])], deps_type=WritDeps,
                  output_type=[str, DeferredToolRequests])
    deps = WritDeps(client=writ, read=read_record)
    result = await agent.run("Refund pay_1001", deps=deps)
    saved = (result.all_messages_json(), result.output)        # the approval request
    ...
    result = await agent.run(message_history=ModelMessagesTypeAdapter.validate_json(saved[0]),
                             deferred_tool_results=approval_results(saved[1]), deps=WritDeps(client=writ, read=read_record))
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, Union

from pydantic import BaseModel

try:
    from pydantic_ai import ApprovalRequired, DeferredToolRequests, DeferredToolResults, RunContext, Tool, ToolApproved, ToolDenied
    from pydantic_ai.messages import ToolReturnPart
except ImportError as err:  # pragma: no cover
    raise ImportError("writ_client.pydantic_ai needs Pydantic AI: pip install 'writ-client[pydantic-ai]'") from err

from .client import IntentInput, WritClient
from .keys import KeyedTool, entity_key
from .models import AppliedReply, ConflictReply, EntityRef, EscalatedReply, JsonPatchOp, RejectedReply, SubmitResult, Versioned

__all__ = [
    "DEFAULT_STEP_ID",
    "WritDeps",
    "WritToolSpec",
    "approval_results",
    "recall_versions",
    "to_model_result",
    "writ_read_tool",
    "writ_tool",
]

#: The step id used when the harness gives none: one write per run, tool, target and intent fields.
DEFAULT_STEP_ID = "once-per-run"

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
    """What writ needs from the harness for a run: pass it as ``deps`` (or as ``deps.writ``).

    ``versions`` (entity key → record) and ``bases`` (intent key → the base a
    call was first sent against) are plain JSON: keep them with the run's
    saved state if you resume in another process. Empty is fine too: the
    pinned base travels in the approval request's metadata, and the owner's
    ledger answers a repeat whatever base it carries.
    """

    client: WritClient
    #: Reads a record with its version when the run has not read it yet.
    read: Reader | None = None
    #: The run (conversation) id; default: Pydantic AI's ``conversation_id``, which a run continued from saved messages inherits.
    run_id: str | None = None
    #: A step id, only when the same intent may legitimately happen twice in one run.
    step_id: str | None = None
    #: Deadline of one submission, seconds; past it the tool answers ``unknown``. Default: the client's.
    timeout: float | None = None
    versions: dict[str, dict[str, Any]] = field(default_factory=dict)
    bases: dict[str, dict[str, Any]] = field(default_factory=dict)

    def remember(self, entity: EntityRef, record: Versioned) -> None:
        self.versions[entity.key] = {"state": record.state, "version": record.version}

    def known(self, entity: EntityRef) -> Versioned | None:
        rec = self.versions.get(entity.key)
        return Versioned.model_validate(rec) if rec else None


def _deps_of(ctx: RunContext[Any]) -> WritDeps:
    deps = ctx.deps
    if isinstance(deps, WritDeps):
        return deps
    inner = getattr(deps, "writ", None)
    if isinstance(inner, WritDeps):
        return inner
    raise TypeError("writ tools need WritDeps: run the agent with deps=WritDeps(client=..., read=...) or deps with a .writ attribute")


async def _read(reader: Reader | None, entity: EntityRef) -> Versioned:
    if reader is None:
        raise TypeError("writ tools need a way to read records: WritDeps(read=...) or writ_tool(..., read=...)")
    got = reader(entity)
    if inspect.isawaitable(got):
        got = await got
    return got if isinstance(got, Versioned) else Versioned.model_validate(got)


def to_model_result(result: SubmitResult) -> dict[str, Any]:
    """A reply in the shape a model can act on (TypeScript's ``toModelResult``): what happened and what to do next."""
    if isinstance(result, AppliedReply):
        return {
            "status": "applied",
            "duplicate": result.duplicate,
            "record": result.state,
            "version": result.version,
            "instruction": "This write had already been applied; nothing was written again. Do not call the tool again for it."
            if result.duplicate
            else "The write was applied. Do not call the tool again for it.",
        }
    if isinstance(result, ConflictReply):
        return {
            "status": "conflict",
            "cycle": result.cycle,
            "current": result.current.model_dump(mode="json", by_alias=True),
            "your_change": [op.model_dump(mode="json", by_alias=True) for op in result.your_change],
            "instruction": "The record changed since it was read; your change was NOT applied. Look at `current` and decide again: "
            "call the tool again only if the change is still right for the current record.",
        }
    if isinstance(result, RejectedReply):
        return {"status": "rejected", "reason": result.reason, "message": result.message, "instruction": "The write was refused and nothing was written. Do not retry it unchanged."}
    if isinstance(result, EscalatedReply):
        return {"status": "escalated", "reason": result.reason, "instruction": "A person will handle this write. Tell the user it is with a human; do not retry."}
    # unknown, and blocked (which is unknown with a visible reason)
    return {
        "status": "unknown",
        "instruction": "No answer yet: the write may or may not have happened. Do not assume it failed and do not retry with new ids; "
        "calling the same tool with the same arguments again is safe and asks for the outcome.",
    }


def recall_versions(deps: WritDeps, outputs: Iterable[Any]) -> None:
    """Fills ``deps.versions``, for records it does not know yet, from tool results already in the conversation (oldest first).

    Read results and write results that carry their ``entity`` (``applied``:
    the new version; ``conflict``: ``current``). A run continued from saved
    messages in a fresh process then bases its writes on what the model saw.
    """
    latest: dict[str, tuple[EntityRef, Versioned]] = {}
    for out in outputs:
        if not isinstance(out, Mapping):
            continue
        ent = out.get("entity")
        if not isinstance(ent, Mapping) or not isinstance(ent.get("type"), str) or not isinstance(ent.get("id"), str):
            continue
        record: Versioned | None = None
        if out.get("status") in ("read", "applied") and isinstance(out.get("version"), str) and not out.get("duplicate"):
            record = Versioned(state=out.get("record"), version=out["version"])
        elif out.get("status") == "conflict" and isinstance(out.get("current"), Mapping) and isinstance(out["current"].get("version"), str):
            record = Versioned(state=out["current"].get("state"), version=out["current"]["version"])
        if record is not None:
            entity = EntityRef(type=ent["type"], id=ent["id"])
            latest[entity.key] = (entity, record)
    for entity, record in latest.values():
        if deps.known(entity) is None:
            deps.remember(entity, record)


def _tool_outputs(ctx: RunContext[Any]) -> list[Any]:
    out: list[Any] = []
    for message in ctx.messages or []:
        for part in getattr(message, "parts", []):
            if isinstance(part, ToolReturnPart):
                out.append(part.content)
    return out


def _params_dict(spec: WritToolSpec[Any], params: BaseModel) -> dict[str, Any]:
    # What goes on the wire and into the key: JSON values; a None the model left out is absent, as in TypeScript (except an intent field).
    dumped = params.model_dump(mode="json", by_alias=True)
    return {k: v for k, v in dumped.items() if v is not None or k in spec.tool.intent_fields}


def writ_tool(
    spec: WritToolSpec[P],
    *,
    requires_approval: bool | Callable[[RunContext[Any], P], bool | Awaitable[bool]] = False,
    read: Reader | None = None,
    name: str | None = None,
    step_id: Callable[[RunContext[Any], P], str | None] | None = None,
) -> Tool[Any]:
    """A Pydantic AI tool that submits each call as a write intent and returns the owner's answer for the model.

    The result is :func:`to_model_result`'s shape plus the ``entity``:
    ``applied`` (with ``duplicate``), ``conflict`` (with ``current`` and
    ``your_change``), ``rejected``, ``escalated`` or ``unknown``, each with an
    instruction. Errors that leave the outcome open (Kafka unreachable) end
    the run; resuming it submits the same intent again, which is safe.
    """
    tool_name = name or spec.tool.name

    async def pin(ctx: RunContext[Any], deps: WritDeps, key: str, entity: EntityRef) -> Versioned:
        pinned = deps.bases.get(key)
        if pinned:
            return Versioned.model_validate(pinned)
        base = deps.known(entity)
        if base is None:
            base = await _read(read or deps.read, entity)
            deps.remember(entity, base)
        deps.bases[key] = {"state": base.state, "version": base.version}
        return base

    async def call(ctx: RunContext[Any], params: BaseModel) -> dict[str, Any]:
        deps = _deps_of(ctx)
        run_id = deps.run_id or getattr(ctx, "conversation_id", None)
        if not run_id:
            raise TypeError("writ tools need a run id: WritDeps(run_id=conversation_id)")
        args = _params_dict(spec, params)
        entity = spec.entity(params)  # type: ignore[arg-type]
        step = (step_id(ctx, params) if step_id else None) or deps.step_id or DEFAULT_STEP_ID  # type: ignore[arg-type]
        key = deps.client.intent_key(tool=spec.tool, run_id=run_id, step_id=step, entity=entity, params=args)
        recall_versions(deps, _tool_outputs(ctx))

        if ctx.tool_call_approved:
            meta = ctx.tool_call_metadata.get("writ") if isinstance(ctx.tool_call_metadata, Mapping) else None
            # The base pinned when approval was asked for (unless the approver changed the arguments: another key).
            if isinstance(meta, Mapping) and meta.get("intentKey") == key and isinstance(meta.get("base"), Mapping):
                deps.bases.setdefault(key, dict(meta["base"]))
        else:
            needed = requires_approval(ctx, params) if callable(requires_approval) else requires_approval  # type: ignore[arg-type]
            if inspect.isawaitable(needed):
                needed = await needed
            if needed:
                base = await pin(ctx, deps, key, entity)
                raise ApprovalRequired(
                    metadata={"writ": {"intentKey": key, "entity": entity.model_dump(), "base": {"state": base.state, "version": base.version}}}
                )

        base = await pin(ctx, deps, key, entity)
        delta = spec.delta(params, base)  # type: ignore[arg-type]
        result = await deps.client.asubmit(
            IntentInput(
                tool=spec.tool,
                entity=entity,
                run_id=run_id,
                step_id=step,
                tool_call_id=ctx.tool_call_id,
                base_version=base.version,
                delta=delta,  # type: ignore[arg-type]
                params=args,
            ),
            timeout=deps.timeout,
        )
        # A repeat (or a truncated reply) carries the version without the record: remembering it would pair a version with no state.
        if isinstance(result, AppliedReply) and not result.duplicate and not result.truncated:
            deps.remember(entity, Versioned(state=result.state, version=result.version))
        if isinstance(result, ConflictReply):
            # The agent decides again from `current`: that is the new base of this intent.
            deps.bases[key] = {"state": result.current.state, "version": result.current.version}
            if not result.truncated:
                deps.remember(entity, result.current)
        return {**to_model_result(result), "entity": entity.model_dump()}

    call.__annotations__ = {"ctx": RunContext[Any], "params": spec.params, "return": dict[str, Any]}
    call.__name__ = tool_name
    return Tool(call, takes_ctx=True, name=tool_name, description=spec.description or spec.tool.description or tool_name)


class _ReadParams(BaseModel):
    type: str
    id: str


def writ_read_tool(record_types: Sequence[str], *, read: Reader | None = None, name: str = "read_record") -> Tool[Any]:
    """A tool that reads a record with its version and remembers the version for the writes that follow."""
    allowed = tuple(record_types)
    if not allowed:
        raise ValueError("record_types: at least one")

    async def read_record(ctx: RunContext[Any], type: str, id: str) -> dict[str, Any]:  # noqa: A002 - the model's names
        if type not in allowed:
            return {"status": "rejected", "reason": "unknown_record_type", "message": f"readable record types: {', '.join(allowed)}", "instruction": "Read one of those."}
        deps = _deps_of(ctx)
        entity = EntityRef(type=type, id=id)
        record = await _read(read or deps.read, entity)
        deps.remember(entity, record)
        return {
            "status": "read",
            "entity": entity.model_dump(),
            "record": record.state,
            "version": record.version,
            "instruction": "This is the record as it is now. Your writes to it are checked against this version.",
        }

    read_record.__annotations__ = {"ctx": RunContext[Any], "type": str, "id": str, "return": dict[str, Any]}
    read_record.__name__ = name
    return Tool(read_record, takes_ctx=True, name=name, description=f"Read a record ({', '.join(allowed)}) with its current version before changing it.")


def approval_results(
    requests: DeferredToolRequests, approve: bool | Mapping[str, bool | ToolApproved | ToolDenied] = True
) -> DeferredToolResults:
    """The ``DeferredToolResults`` that answer ``requests``, carrying the bases writ pinned in their metadata.

    ``approve``: True or False for every approval, or a decision per tool-call id.
    """
    decisions: dict[str, bool | ToolApproved | ToolDenied]
    if isinstance(approve, bool):
        decisions = {call.tool_call_id: approve for call in requests.approvals}
    else:
        decisions = dict(approve)
    return requests.build_results(approvals=decisions, metadata={k: dict(v) for k, v in requests.metadata.items()})
