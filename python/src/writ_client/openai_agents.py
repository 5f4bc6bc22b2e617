"""OpenAI Agents SDK adapter: writ write tools as function tools (``pip install writ-client[openai-agents]``), as
TypeScript's ``producers/adapters/openai-agents.ts`` does for OpenAI Agents JS.

A write tool's call becomes a write intent. The model supplies the params; the run context supplies the run id
(``{"runId": conversation_id}``); the adapter supplies the base version, and keeps what it read inside the run
context (``context["writ"]``: plain JSON), so that a saved ``RunState`` carries it across approval, resume and a
crash between the two.

**Approval** is the SDK's: with ``needs_approval`` the run stops with an interruption; approve it on the
``RunState`` and run again. Before the run stops the adapter reads the record and pins the base the approver saw
in the context, so every resume from that saved state (also a second one from the same older state) is the same
attempt, answered from the owner's ledger (``duplicate: true``) after the first.

Example::

    agent = Agent(name="billing", instructions=..., tools=[
        writ_agent_read_tool(["payment"], read=read_record),
        writ_agent_tool(refund_spec, client=writ, read=read_record, needs_approval=True),
    ])
    result = await Runner.run(agent, "Refund pay_1001", context={"runId": conversation_id})
    saved = result.to_state().to_string()              # paused on the approval
    # later, in any process:
    state = await RunState.from_string(agent, saved)
    state.approve(state.get_interruptions()[0])
    result = await Runner.run(agent, state)             # writes once, however often it is resumed

Tool results are JSON text for the model: :func:`~writ_client.tools.to_model_result`'s shapes plus ``entity``.
Arguments that do not match the tool's parameters are answered ``rejected`` / ``invalid_params`` for the model to fix
(nothing sent, no approval asked). Errors that leave the outcome open (Kafka or the system of record unreachable) end
the run rather than become text for the model; resuming submits the same intent again, which is safe.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

try:
    from agents import FunctionTool, RunContextWrapper
    from agents.strict_schema import ensure_strict_json_schema
    from agents.tool_context import ToolContext
except ImportError as err:  # pragma: no cover
    raise ImportError("writ_client.openai_agents needs the OpenAI Agents SDK: pip install 'writ-client[openai-agents]'") from err

from .client import WritClient
from .models import EntityRef
from .tools import Reader, WritDeps, WritToolSpec, check_run_ids, invalid_params, params_dict, pin_base, read_result, read_with, step_or_default, submit_tool_call

__all__ = ["writ_agent_read_tool", "writ_agent_tool"]

P = TypeVar("P", bound=BaseModel)
ApprovalPolicy = Callable[[RunContextWrapper[Any], P, str], "bool | Awaitable[bool]"]


def _records(context: Any, tool: str) -> MutableMapping[str, Any]:
    """The adapter's records in the run context (``context["writ"]``), made on first use."""
    if not isinstance(context, MutableMapping):
        raise TypeError(f"tool {tool}: run the agent with a dict context, e.g. Runner.run(agent, input, context={{'runId': conversation_id}})")
    held = context.setdefault("writ", {})
    if not isinstance(held, MutableMapping):
        raise TypeError(f"tool {tool}: context['writ'] is the adapter's; it holds {type(held).__name__}")
    for part in ("versions", "bases"):
        if not isinstance(held.get(part), dict):
            held[part] = {}
    return held


def _deps(context: Any, tool: str, client: WritClient, read: Reader | None, timeout: float | None) -> WritDeps:
    """A view of the run context: writes to its versions and bases land in ``context["writ"]`` (serialized by RunState)."""
    held = _records(context, tool)
    return WritDeps(client=client, read=read, timeout=timeout, versions=held["versions"], bases=held["bases"])


def _parse(spec: WritToolSpec[P], raw: Any) -> tuple[P, EntityRef]:
    """The model's arguments and the record they name; a pydantic ``ValidationError`` when they do not match the
    tool's parameters (or name a record no intent can carry)."""
    params = spec.params.model_validate_json(raw) if isinstance(raw, (str, bytes)) else spec.params.model_validate(raw)
    return params, spec.entity(params)


def writ_agent_tool(
    spec: WritToolSpec[P],
    *,
    client: WritClient,
    read: Reader,
    needs_approval: bool | ApprovalPolicy[P] = False,
    run_id: Callable[[Any], str | None] | None = None,
    step_id: Callable[[Any, P], str | None] | None = None,
    timeout: float | None = None,
    name: str | None = None,
) -> FunctionTool:
    """A function tool that submits each call as a write intent and returns the owner's answer for the model
    (JSON): ``applied`` (with ``duplicate``), ``conflict`` (with ``current`` and ``your_change``), ``rejected``,
    ``escalated`` or ``unknown``, each with an instruction, and the ``entity``.

    ``read``: a record with its version, when the run has not read it yet. ``needs_approval``: True, or a policy
    ``(run context, params, call id) -> bool``. ``run_id``: of the run context (default ``context["runId"]``).
    ``step_id``: only when the same intent may legitimately happen twice in one run (default one write per run,
    tool, target and intent fields: what survives a re-plan under a new tool-call id).
    """
    tool_name = name or spec.tool.name

    def call_key(context: Any, params: P, entity: EntityRef) -> tuple[WritDeps, str, str, str]:
        own_run = run_id is not None
        rid = run_id(context) if run_id else (context.get("runId") if isinstance(context, Mapping) else None)
        if rid is None or rid == "":
            raise ValueError(f"tool {tool_name}: no run id: Runner.run(agent, input, context={{'runId': conversation_id}}); a random one would defeat deduplication")
        own_step = step_id(context, params) if step_id else None
        step = step_or_default(own_step, None)
        # Before anything is read or pinned under them (a run id over 256 characters read the record, then failed at encoding).
        check_run_ids(rid, step, run_name="run_id(context)" if own_run else "context['runId']", step_name="step_id(context, params)")
        deps = _deps(context, tool_name, client, read, timeout)
        key = client.intent_key(tool=spec.tool, run_id=rid, step_id=step, entity=entity, params=params_dict(spec, params))
        return deps, rid, step, key

    async def approval(ctx: RunContextWrapper[Any], raw: dict[str, Any], call_id: str) -> bool:
        # The SDK asks before it parses: arguments that do not parse are answered `rejected` (invalid_params) by the
        # tool, nothing written, so there is nothing to approve. Parsed here and raised, they ended the run.
        try:
            params, entity = _parse(spec, raw)
        except ValidationError:
            return False
        needed = needs_approval(ctx, params, call_id) if callable(needs_approval) else needs_approval is True
        if inspect.isawaitable(needed):
            needed = await needed
        if needed:
            # Before the run stops: the version the approver sees is the one every resume writes against.
            deps, _, _, key = call_key(ctx.context, params, entity)
            await pin_base(deps, key, entity, read, call_id)
        return bool(needed)

    async def invoke(ctx: ToolContext[Any], raw: str) -> str:
        try:
            params, entity = _parse(spec, raw)
        except ValidationError as err:
            # The model's arguments, nothing sent: answered for the model to fix, as the other adapters' frameworks do.
            # Raised, they ended the whole run (the SDK's UserError), and a resume met them again.
            return json.dumps(invalid_params(err), separators=(",", ":"))
        deps, rid, step, key = call_key(ctx.context, params, entity)
        result = await submit_tool_call(deps, spec, params, run_id=rid, step_id=step, key=key, entity=entity, tool_call_id=ctx.tool_call_id, read=read)
        return json.dumps(result, separators=(",", ":"))

    return FunctionTool(
        name=tool_name,
        description=spec.description or spec.tool.description or tool_name,
        params_json_schema=ensure_strict_json_schema(spec.params.model_json_schema()),
        on_invoke_tool=invoke,
        strict_json_schema=True,
        needs_approval=approval if needs_approval is not False else False,
    )


class _ReadArgs(BaseModel):
    type: str = Field(min_length=1, max_length=64)
    id: str = Field(min_length=1, max_length=256)


def writ_agent_read_tool(record_types: Sequence[str], *, read: Reader, name: str = "read_record") -> FunctionTool:
    """A function tool that reads a record (of ``record_types``) with its version, and remembers the version in the
    run context for the writes that follow."""
    allowed = tuple(record_types)
    if not allowed:
        raise ValueError("record_types: at least one")
    schema = {
        "type": "object",
        "properties": {"type": {"type": "string", "enum": list(allowed)}, "id": {"type": "string", "minLength": 1, "maxLength": 256}},
        "required": ["type", "id"],
        "additionalProperties": False,
    }

    async def invoke(ctx: ToolContext[Any], raw: str) -> str:
        try:
            args = _ReadArgs.model_validate_json(raw)
            if args.type not in allowed:
                return json.dumps({"status": "rejected", "reason": "unknown_record_type", "message": f"readable record types: {', '.join(allowed)}", "instruction": "Read one of those."})
            entity = EntityRef(type=args.type, id=args.id)
        except ValidationError as err:
            return json.dumps(invalid_params(err), separators=(",", ":"))
        record = await read_with(read, entity)
        held = _records(ctx.context, name)
        held["versions"][entity.key] = {"state": record.state, "version": record.version}
        return json.dumps(read_result(entity, record), separators=(",", ":"))

    return FunctionTool(
        name=name,
        description=f"Read a record ({', '.join(allowed)}) with its current version before changing it.",
        params_json_schema=schema,
        on_invoke_tool=invoke,
        strict_json_schema=True,
    )
