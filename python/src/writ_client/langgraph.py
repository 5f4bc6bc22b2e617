"""LangChain and LangGraph adapter: writ write tools as LangChain tools for a LangGraph tool loop
(``pip install writ-client[langgraph]``), as TypeScript's ``producers/adapters/langchain.ts`` does for LangChain.js.

A write tool's call becomes a write intent. The model supplies the params; the run id is the graph's thread
(``config["configurable"]["thread_id"]``), and the base version comes from what the thread has read (never the
model). Approval is LangGraph's human in the loop: the tool calls ``interrupt()`` before it writes, and the graph
goes on with ``Command(resume={"approved": True})``.

On resume LangGraph runs the interrupted node again from its start, and a thread replayed from an older checkpoint
(after a crash before the newer one was stored) runs the tool again after the write. Both reach the same intent key
(thread id, step id, tool, record, intent fields), so the owner's ledger answers with the stored reply: one write.

The tools need LangGraph's ``ToolNode`` (or ``create_react_agent``), which injects the call's ``ToolRuntime``: the
thread's config, its state (the read results the thread holds: a fresh process replaying a thread finds the base
there, in ``ToolMessage.artifact``) and the tool-call id.

Example::

    deps = WritDeps(client=writ, read=read_record)
    tools = [writ_langchain_read_tool("payment", deps), writ_langchain_tool(refund_spec, deps, approval=True)]
    # build_tool_loop: your StateGraph, the model's node and a ToolNode (as examples/langgraph_refund.py builds one)
    graph = build_tool_loop(model.bind_tools(tools), ToolNode(tools)).compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": conversation_id}}
    await graph.ainvoke({"messages": [("user", "Refund pay_1001")]}, config)   # stops at the interrupt
    await graph.ainvoke(Command(resume={"approved": True}), config)
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar, Union

from pydantic import BaseModel, Field

try:
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import StructuredTool
    from langgraph.prebuilt import ToolRuntime
    from langgraph.types import interrupt
except ImportError as err:  # pragma: no cover
    raise ImportError("writ_client.langgraph needs LangGraph: pip install 'writ-client[langgraph]'") from err

from .models import EntityRef
from .tools import Reader, RunIdInvalid, WritDeps, WritToolSpec, check_run_ids, params_dict, pin_base, read_result, read_with, recall_versions, step_or_default, submit_tool_call

__all__ = ["APPROVAL_REQUEST_TYPE", "WritContext", "approval_request", "writ_langchain_read_tool", "writ_langchain_tool"]

#: The ``type`` of the interrupt value a write tool raises when it needs approval.
APPROVAL_REQUEST_TYPE = "writ_approval"

P = TypeVar("P", bound=BaseModel)
#: What the harness gives the tools: a :class:`WritDeps`, or a function of the call that returns one (per thread,
#: per user…). The thread id wins over ``WritDeps.run_id``, which serves a tool called outside a thread.
WritContext = Union[WritDeps, Callable[[ToolRuntime], Union[WritDeps, Awaitable[WritDeps]]]]


def approval_request(value: Any) -> dict[str, Any] | None:
    """The write tool's approval request in an interrupt's value (``{"type": "writ_approval", "tool", "entity",
    "params", "toolCallId"}``), or None when the interrupt is not writ's."""
    return dict(value) if isinstance(value, Mapping) and value.get("type") == APPROVAL_REQUEST_TYPE else None


async def _deps(context: WritContext, runtime: ToolRuntime) -> WritDeps:
    got = context(runtime) if callable(context) and not isinstance(context, WritDeps) else context
    if inspect.isawaitable(got):
        got = await got
    if not isinstance(got, WritDeps):
        raise TypeError("writ tools need WritDeps: writ_langchain_tool(spec, WritDeps(client=..., read=...)) or a function of the call returning one")
    return got


def _thread_id(runtime: ToolRuntime) -> str | None:
    """The thread id as a run id: a string as given; a number or a UUID as text, as LangGraph keys its thread
    (``str()``), a float printed as JavaScript prints it (42.0 as "42"), so the TypeScript adapter makes the same
    run of the same id; None for None or "". Anything else (a bool, a tuple) is refused naming it: passed over, the
    call fell back to ``WritDeps.run_id``, so writes of two threads shared one run (the second answered as a repeat,
    never written)."""
    configurable = (runtime.config or {}).get("configurable") or {}
    thread = configurable.get("thread_id") if isinstance(configurable, Mapping) else None
    if thread is None or thread == "":
        return None
    if isinstance(thread, str):
        return thread
    if isinstance(thread, bool):
        pass
    elif isinstance(thread, int):
        return str(int(thread))
    elif isinstance(thread, float) and math.isfinite(thread):
        return str(int(thread)) if thread.is_integer() and abs(thread) < 1e21 else repr(thread)
    elif isinstance(thread, uuid.UUID):
        return str(thread)
    raise RunIdInvalid("configurable.thread_id", f"configurable.thread_id must be a string, a number or a UUID (it is {type(thread).__name__})")


def _thread_tool_outputs(runtime: ToolRuntime) -> list[Any]:
    """Artifacts of the tool messages in the graph state, oldest first."""
    state = runtime.state
    messages = state.get("messages") if isinstance(state, Mapping) else getattr(state, "messages", None)
    if not isinstance(messages, list):
        return []
    return [m.artifact for m in messages if isinstance(m, ToolMessage)]


def _sync(coroutine: Callable[..., Coroutine[Any, Any, tuple[str, dict[str, Any]]]]) -> Callable[..., tuple[str, dict[str, Any]]]:
    """The tool for ``graph.invoke`` (LangGraph runs a sync tool in a worker thread, with no event loop): the same
    coroutine run to its end there. The thread's context (LangGraph's config, for ``interrupt()``) goes with it."""

    def run(runtime: ToolRuntime, **raw: Any) -> tuple[str, dict[str, Any]]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coroutine(runtime, **raw))
        raise RuntimeError("a writ tool called synchronously inside a running event loop: use graph.ainvoke (or astream)")

    return run


def _as_output(result: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    # content_and_artifact: the content is the JSON the model reads, the artifact the same object for the harness.
    return json.dumps(result, separators=(",", ":")), result


def writ_langchain_tool(
    spec: WritToolSpec[P],
    context: WritContext,
    *,
    approval: bool | Callable[[P], bool] = False,
    read: Reader | None = None,
    name: str | None = None,
    step_id: Callable[[P], str | None] | None = None,
) -> StructuredTool:
    """A LangChain tool that submits each call as a write intent and answers with the owner's reply for the model.

    The answer (content: its JSON; artifact: the object) is :func:`~writ_client.tools.to_model_result`'s shape
    plus the ``entity``: ``applied`` (with ``duplicate``), ``conflict`` (with ``current`` and ``your_change``),
    ``rejected``, ``escalated`` or ``unknown``, each with an instruction; ``denied`` when a person said no.

    ``approval`` (True, or a function of the params): before the write the tool pins the base version (a read at
    most) and calls ``interrupt()`` with ``{"type": "writ_approval", "tool", "entity", "params", "toolCallId"}``;
    resume with ``Command(resume={"approved": True})`` (or False, or ``{"approved": False, "reason": ...}``: the
    model is told nothing was written). Needs a graph with a checkpointer.
    """
    tool_name = name or spec.tool.name

    async def call(runtime: ToolRuntime, **raw: Any) -> tuple[str, dict[str, Any]]:
        deps = await _deps(context, runtime)
        params = spec.params.model_validate(raw)
        thread = _thread_id(runtime)
        run_id = thread or deps.run_id
        if run_id is None or run_id == "":
            raise ValueError(f"writ tool {tool_name}: no run id (no configurable.thread_id, no WritDeps.run_id); a random one would defeat deduplication")
        own_step = step_id(params) if step_id else None
        step = step_or_default(own_step, deps.step_id)
        # Before anything is read or pinned under them, naming where they came from.
        check_run_ids(
            run_id,
            step,
            run_name="configurable.thread_id" if thread else "WritDeps.run_id",
            step_name="step_id(params)" if own_step is not None else "WritDeps.step_id",
        )
        entity = spec.entity(params)
        args = params_dict(spec, params)
        key = deps.client.intent_key(tool=spec.tool, run_id=run_id, step_id=step, entity=entity, params=args)
        recall_versions(deps, _thread_tool_outputs(runtime))
        needed = approval(params) if callable(approval) else approval is True
        if needed:
            # This function runs again from its start on resume: before the interrupt only the pin (a read at
            # most) happens, so the approved write, and any replay of it, goes against the version there when asked.
            await pin_base(deps, key, entity, read, runtime.tool_call_id)
            request = {"type": APPROVAL_REQUEST_TYPE, "tool": tool_name, "entity": entity.model_dump(), "params": args}
            if runtime.tool_call_id:
                request["toolCallId"] = runtime.tool_call_id
            decision = interrupt(request)
            approved = decision is True or (isinstance(decision, Mapping) and decision.get("approved") is True)
            if not approved:
                reason = decision.get("reason") if isinstance(decision, Mapping) else None
                denied: dict[str, Any] = {"status": "denied"}
                if isinstance(reason, str) and reason:
                    denied["reason"] = reason[:2000]
                denied["instruction"] = "A person did not approve this write; nothing was written. Do not call the tool again for it unless the user asks."
                denied["entity"] = entity.model_dump()
                return _as_output(denied)
        result = await submit_tool_call(deps, spec, params, run_id=run_id, step_id=step, key=key, entity=entity, tool_call_id=runtime.tool_call_id, read=read)
        return _as_output(result)

    call.__name__ = tool_name
    return StructuredTool.from_function(
        func=_sync(call),
        coroutine=call,
        name=tool_name,
        description=spec.description or spec.tool.description or tool_name,
        args_schema=spec.params,
        response_format="content_and_artifact",
        infer_schema=False,
    )


class _ReadArgs(BaseModel):
    id: str = Field(min_length=1, max_length=256)


def writ_langchain_read_tool(
    record_type: str, context: WritContext, *, read: Reader | None = None, name: str | None = None, description: str | None = None
) -> StructuredTool:
    """A LangChain tool that reads one record type's record by id with its version (``get_<record type>`` unless
    named), and remembers the version for the writes that follow; its artifact carries it in the thread's state."""
    if not isinstance(record_type, str) or not record_type:
        raise ValueError("record_type: a record type, e.g. 'payment'")

    async def read_record(runtime: ToolRuntime, **raw: Any) -> tuple[str, dict[str, Any]]:
        deps = await _deps(context, runtime)
        # As the write tool does: a run whose ids no intent can carry is refused at its first call, before a read the
        # model would go on from to a write that fails. A read with no run id at all (outside a thread) is served.
        thread = _thread_id(runtime)
        run_id = thread or deps.run_id
        if run_id is not None and run_id != "":
            check_run_ids(run_id, step_or_default(None, deps.step_id), run_name="configurable.thread_id" if thread else "WritDeps.run_id", step_name="WritDeps.step_id")
        entity = EntityRef(type=record_type, id=_ReadArgs.model_validate(raw).id)
        record = await read_with(read or deps.read, entity)
        deps.remember(entity, record)
        return _as_output(read_result(entity, record))

    tool_name = name or f"get_{record_type}"
    read_record.__name__ = tool_name
    return StructuredTool.from_function(
        func=_sync(read_record),
        coroutine=read_record,
        name=tool_name,
        description=description or f"Read a {record_type} record with its current version before changing it.",
        args_schema=_ReadArgs,
        response_format="content_and_artifact",
        infer_schema=False,
    )
