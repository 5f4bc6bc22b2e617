"""``python -m writ_client.examples.langgraph_refund``: a refund through a LangGraph tool loop, with approval by
``interrupt()``, resumed, then replayed from the checkpoint at the interrupt; written once.

No API key: the model's turns are scripted (read the payment, then ask for the refund, then say what came back),
in a ``StateGraph`` with LangGraph's ``ToolNode`` and an in-memory checkpointer. The broker, registry, records
server and owner are real. Where it runs is as for ``writ_client.examples.refund`` (``RECORDS_URL``,
``KAFKA_BROKERS``, ``SCHEMA_REGISTRY_URL``, ``WRIT_INTENTS_TOPIC``, ``WRIT_EXAMPLE_START``).

The last line is one JSON object, measured at the records server: ``{"refunds_created":1}``.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from ..client import WritClient
from ..devstack import RecordsAdmin
from ..langgraph import approval_request, writ_langchain_read_tool, writ_langchain_tool
from ..tools import WritDeps
from ._run import Say, count_refunds, run_example
from .demo_specs import refund_spec
from .refund import describe

__all__ = ["main", "refund_graph", "refund_flow"]


def _scripted_turn(payment_id: str, amount_cents: int) -> Any:
    """The model's turn: read the payment first, then refund, then one sentence on what came back."""

    def turn(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        if not isinstance(last, ToolMessage):
            call = {"name": "get_payment", "args": {"id": payment_id}}
        elif last.name == "get_payment":
            args = {"paymentId": payment_id, "amountCents": amount_cents, "reason": "damaged", "note": "Customer sent photos of the broken item."}
            call = {"name": "refund_payment", "args": args}
        else:
            out = last.artifact if isinstance(last.artifact, dict) else {}
            done = out.get("status") == "applied"
            text = ("The refund is done" + (" (it had already been made)." if out.get("duplicate") else ".")) if done else f"The refund came back {out.get('status')}."
            return {"messages": [AIMessage(text)]}
        # A model gives each tool call an id of its own.
        return {"messages": [AIMessage("", tool_calls=[{**call, "id": f"call_{uuid.uuid4().hex[:12]}"}])]}

    return turn


def refund_graph(deps: WritDeps, payment_id: str, saver: InMemorySaver, amount_cents: int = 5000) -> Any:
    """The tool loop: the model's turn, a ToolNode with the read tool and the refund tool (approval), a checkpointer."""
    tools = [writ_langchain_read_tool("payment", deps), writ_langchain_tool(refund_spec, deps, approval=True)]
    g = StateGraph(MessagesState)
    g.add_node("agent", _scripted_turn(payment_id, amount_cents))
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver)


async def refund_flow(client: WritClient, records: RecordsAdmin, payment_id: str, say: Say, *, timeout: float = 60) -> dict[str, Any]:
    """Turn 1 stops at the approval interrupt; the thread is resumed in a fresh harness (no reader: the base is the
    read in the thread's state), then replayed from the checkpoint at the interrupt, as after a crash before the
    newer checkpoint was stored."""
    saver = InMemorySaver()
    thread = {"configurable": {"thread_id": f"conv-{payment_id}"}}

    def harness(read: bool) -> Any:
        deps = WritDeps(client=client, read=(lambda e: records.read(e.type, e.id)) if read else None, timeout=timeout)
        return refund_graph(deps, payment_id, saver)

    def tool_lines(messages: list[Any], prefix: str) -> list[dict[str, Any]]:
        refunds = []
        for m in messages:
            if isinstance(m, ToolMessage):
                say(f"{prefix}{m.name}: {describe(m.artifact)}")
                if m.name == "refund_payment":
                    refunds.append(m.artifact)
        return refunds

    say(f"turn 1: the customer asks for 50.00 EUR back on {payment_id} (item arrived damaged)")
    turn1 = await harness(read=True).ainvoke({"messages": [HumanMessage(f"My order {payment_id} arrived broken. Please refund 50 EUR.")]}, thread)
    tool_lines(turn1["messages"], "  model -> ")
    requests = [r for r in (approval_request(i.value) for i in turn1.get("__interrupt__", [])) if r]
    if not requests:
        raise RuntimeError(f"expected an approval interrupt, got {turn1!r:.500}")
    for r in requests:
        say(f"  model -> {r['tool']} {r['params']}: interrupted for approval")
    at_interrupt = harness(read=False).get_state(thread).config
    say("a person approves; a fresh harness resumes the thread")
    outputs = []
    for label, config in (("resume", thread), ("replay from the checkpoint at the interrupt (as after a crash before the newer one was stored)", at_interrupt)):
        say(f"  {label}:")
        done = await harness(read=False).ainvoke(Command(resume={"approved": True}), config)
        outputs += tool_lines(done["messages"][len(turn1["messages"]) :], "    ")
        say(f"    model: {done['messages'][-1].content}")
    return {"refunds_created": count_refunds(records, payment_id, say), "outputs": outputs, "requests": requests}


def main() -> int:
    return run_example("LangGraph", "langgraph", refund_flow)


if __name__ == "__main__":
    sys.exit(main())
