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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

try:
    from pydantic_ai import ApprovalRequired, DeferredToolRequests, DeferredToolResults, RunContext, Tool, ToolApproved, ToolDenied
    from pydantic_ai.messages import ToolReturnPart
except ImportError as err:  # pragma: no cover
    raise ImportError("writ_client.pydantic_ai needs Pydantic AI: pip install 'writ-client[pydantic-ai]'") from err

from .models import EntityRef
from .tools import DEFAULT_STEP_ID, Reader, WritDeps, WritToolSpec, check_run_ids, params_dict, pin_base, pin_call_base, read_result, read_with, recall_versions, step_or_default, submit_tool_call, to_model_result

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

P = TypeVar("P", bound=BaseModel)


def _deps_of(ctx: RunContext[Any]) -> WritDeps:
    deps = ctx.deps
    if isinstance(deps, WritDeps):
        return deps
    inner = getattr(deps, "writ", None)
    if isinstance(inner, WritDeps):
        return inner
    raise TypeError("writ tools need WritDeps: run the agent with deps=WritDeps(client=..., read=...) or deps with a .writ attribute")


def _tool_outputs(ctx: RunContext[Any]) -> list[Any]:
    out: list[Any] = []
    for message in ctx.messages or []:
        for part in getattr(message, "parts", []):
            if isinstance(part, ToolReturnPart):
                out.append(part.content)
    return out


def _run_id(ctx: RunContext[Any], deps: WritDeps) -> tuple[Any, str]:
    """The run id of a call (``WritDeps.run_id``, else Pydantic AI's ``conversation_id``) and where it came from."""
    if deps.run_id is not None and deps.run_id != "":
        return deps.run_id, "WritDeps.run_id"
    return getattr(ctx, "conversation_id", None), "conversation_id"


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

    async def call(ctx: RunContext[Any], params: BaseModel) -> dict[str, Any]:
        deps = _deps_of(ctx)
        run_id, run_name = _run_id(ctx, deps)
        if run_id is None or run_id == "":
            raise TypeError("writ tools need a run id: WritDeps(run_id=conversation_id)")
        own_step = (step_id(ctx, params) if step_id else None)  # type: ignore[arg-type]
        step = step_or_default(own_step, deps.step_id)
        # Before anything is read or pinned under them, and not as a ValidationError: Pydantic AI hands those to the
        # model as its own arguments' fault, and the model cannot fix the harness's id.
        check_run_ids(run_id, step, run_name=run_name, step_name="step_id(ctx, params)" if own_step is not None else "WritDeps.step_id")
        args = params_dict(spec, params)
        entity = spec.entity(params)  # type: ignore[arg-type]
        key = deps.client.intent_key(tool=spec.tool, run_id=run_id, step_id=step, entity=entity, params=args)
        recall_versions(deps, _tool_outputs(ctx))

        if ctx.tool_call_approved:
            meta = ctx.tool_call_metadata.get("writ") if isinstance(ctx.tool_call_metadata, Mapping) else None
            # The base pinned for this call when approval was asked for (unless the approver changed the arguments:
            # another key), kept by the call however the pin has moved since.
            if isinstance(meta, Mapping) and meta.get("intentKey") == key and isinstance(meta.get("base"), Mapping):
                pin_call_base(deps, key, ctx.tool_call_id, meta["base"])
        else:
            needed = requires_approval(ctx, params) if callable(requires_approval) else requires_approval  # type: ignore[arg-type]
            if inspect.isawaitable(needed):
                needed = await needed
            if needed:
                base = await pin_base(deps, key, entity, read, ctx.tool_call_id)
                raise ApprovalRequired(
                    metadata={"writ": {"intentKey": key, "entity": entity.model_dump(), "base": {"state": base.state, "version": base.version}}}
                )

        return await submit_tool_call(deps, spec, params, run_id=run_id, step_id=step, key=key, entity=entity, tool_call_id=ctx.tool_call_id, read=read)

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
        # As the write tool does: a run whose ids no intent can carry is refused at its first call, before a read the
        # model would go on from to a write that fails.
        run_id, run_name = _run_id(ctx, deps)
        if run_id is not None and run_id != "":
            check_run_ids(run_id, step_or_default(None, deps.step_id), run_name=run_name, step_name="WritDeps.step_id")
        entity = EntityRef(type=type, id=id)
        record = await read_with(read or deps.read, entity)
        deps.remember(entity, record)
        return read_result(entity, record)

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
