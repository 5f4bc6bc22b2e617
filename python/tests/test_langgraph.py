"""The LangGraph adapter in a real LangGraph tool loop (``ToolNode``, a checkpointer), against the TypeScript owner,
counted at the records server (its own Idempotency-Key dedupe off): approval by interrupt, resume in a fresh harness,
a replay and a re-plan under a new tool-call id from older checkpoints, written once; a conflict the model decides
again; a denial that writes nothing."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from writ_client import WritClient
from writ_client.devstack import ChildProcess, RecordsAdmin, Stack
from writ_client.examples.demo_specs import refund_spec, tag_spec
from writ_client.langgraph import approval_request, writ_langchain_read_tool, writ_langchain_tool
from writ_client.tools import RunIdInvalid, WritDeps

from .conftest import run_example_against
from .scripted_client import AppliedClient, CountingReader

Script = Callable[[list[Any]], AIMessage]


def call(name: str, args: dict[str, Any]) -> AIMessage:
    # A model's tool call: a fresh id each time, as a model re-planning gives one.
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call_{uuid.uuid4().hex[:12]}"}])


def build(tools: list[Any], script: Script, saver: InMemorySaver) -> Any:
    """The usual tool loop: the model node (scripted: it acts on the messages so far), a ToolNode, a checkpointer."""
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda state: {"messages": [script(state["messages"])]})
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver)


def outputs(messages: list[Any], tool: str) -> list[dict[str, Any]]:
    return [m.artifact for m in messages if isinstance(m, ToolMessage) and m.name == tool]


def refund_script(pid: str) -> Script:
    def script(messages: list[Any]) -> AIMessage:
        last = messages[-1]
        if not isinstance(last, ToolMessage):
            return call("get_payment", {"id": pid})
        if last.name == "get_payment":
            return call("refund_payment", {"paymentId": pid, "amountCents": 5000, "reason": "damaged"})
        return AIMessage(f"refund: {json.loads(last.content)['status']}")

    return script


def test_approval_resume_replay_and_replan_write_one_refund(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid = f"pay_lg_{uid}"
    records.seed("payment", pid, {"customer": "c-77", "amountCents": 12000, "currency": "EUR", "refunds": []})
    saver = InMemorySaver()
    thread = {"configurable": {"thread_id": f"conv-{uid}"}}

    def harness(read: bool) -> Any:
        """A fresh harness over the same checkpoints (as a new process would be); without a reader it can base its
        writes only on what the thread has read."""
        deps = WritDeps(client=client, read=(lambda e: records.read(e.type, e.id)) if read else None, timeout=30)
        return build([writ_langchain_read_tool("payment", deps), writ_langchain_tool(refund_spec, deps, approval=True)], refund_script(pid), saver)

    async def flow() -> dict[str, Any]:
        first = await harness(read=True).ainvoke({"messages": [HumanMessage(f"Refund 50 EUR of {pid}, it arrived broken")]}, thread)
        asked = [approval_request(i.value) for i in first["__interrupt__"]]
        at_interrupt = harness(read=False).get_state(thread).config
        # Before the refund call was planned: the model's turn after the read runs again, with a new tool-call id.
        before_plan = next(s.config for s in harness(read=False).get_state_history(thread) if s.next == ("agent",) and outputs(s.values["messages"], "get_payment"))
        resumed = await harness(read=False).ainvoke(Command(resume={"approved": True}), thread)
        replayed = await harness(read=False).ainvoke(Command(resume={"approved": True}), at_interrupt)
        replanned = await harness(read=False).ainvoke(None, before_plan)
        replanned_asked = [approval_request(i.value) for i in replanned["__interrupt__"]]
        # The fork is the thread's latest checkpoint now; a bare True approves too.
        replanned_done = await harness(read=False).ainvoke(Command(resume=True), thread)
        return {"asked": asked, "resumed": resumed, "replayed": replayed, "replanned_asked": replanned_asked, "replanned": replanned_done}

    out = asyncio.run(flow())
    assert [a and (a["tool"], a["entity"], a["params"]["amountCents"]) for a in out["asked"]] == [("refund_payment", {"type": "payment", "id": pid}, 5000)]
    assert out["replanned_asked"][0] and out["replanned_asked"][0]["toolCallId"] != out["asked"][0]["toolCallId"]
    results = [outputs(out[k]["messages"], "refund_payment")[-1] for k in ("resumed", "replayed", "replanned")]
    assert [(r["status"], r["duplicate"], r["version"]) for r in results] == [("applied", False, '"v2"'), ("applied", True, '"v2"'), ("applied", True, '"v2"')], results
    assert out["resumed"]["messages"][-1].content == "refund: applied"
    # Measured at the records server: one refund, one PATCH for the intent key.
    assert records.read("payment", pid)["state"]["refunds"] == [{"amountCents": 5000, "reason": "damaged"}]
    key = client.intent_key(tool=refund_spec.tool, run_id=f"conv-{uid}", step_id="once-per-run", entity={"type": "payment", "id": pid}, params={"paymentId": pid, "amountCents": 5000, "reason": "damaged"})
    assert records.patch_requests(key) == 1


def test_a_denial_writes_nothing_and_tells_the_model(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid = f"pay_lgd_{uid}"
    records.seed("payment", pid, {"customer": "c-78", "amountCents": 9000, "currency": "EUR", "refunds": []})
    deps = WritDeps(client=client, read=lambda e: records.read(e.type, e.id), timeout=30)
    graph = build([writ_langchain_read_tool("payment", deps), writ_langchain_tool(refund_spec, deps, approval=lambda p: p.amountCents > 1000)], refund_script(pid), InMemorySaver())
    thread = {"configurable": {"thread_id": f"conv-d-{uid}"}}

    # Synchronously this time: LangGraph runs the tool in a worker thread.
    asked = graph.invoke({"messages": [HumanMessage("refund")]}, thread)["__interrupt__"]
    assert approval_request(asked[0].value) is not None
    done = graph.invoke(Command(resume={"approved": False, "reason": "over the limit"}), thread)
    [denied] = outputs(done["messages"], "refund_payment")
    assert (denied["status"], denied["reason"], denied["entity"]["id"]) == ("denied", "over the limit", pid), denied
    assert done["messages"][-1].content == "refund: denied"
    assert records.read("payment", pid) == {"state": {"customer": "c-78", "amountCents": 9000, "currency": "EUR", "refunds": []}, "version": '"v1"'}
    key = client.intent_key(tool=refund_spec.tool, run_id=f"conv-d-{uid}", step_id="once-per-run", entity={"type": "payment", "id": pid}, params={"paymentId": pid, "amountCents": 5000, "reason": "damaged"})
    assert records.patch_requests(key) == 0


def test_a_conflict_goes_back_to_the_model_which_decides_again(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    tid = f"T-lg-{uid}"
    records.seed("ticket", tid, {"subject": "Charged twice", "status": "open", "tags": ["billing"]})

    def script(messages: list[Any]) -> AIMessage:
        last = messages[-1]
        if not isinstance(last, ToolMessage):
            return call("get_ticket", {"id": tid})
        if last.name == "get_ticket":
            # Someone else tags the ticket after the agent read it.
            records.seed("ticket", tid, {"subject": "Charged twice", "status": "open", "tags": ["billing", "chargeback-risk"]})
        if last.artifact["status"] in ("read", "conflict"):
            return call("tag_ticket", {"ticketId": tid, "tag": "vip"})
        return AIMessage(f"tag: {last.artifact['status']}")

    deps = WritDeps(client=client, read=lambda e: records.read(e.type, e.id), timeout=30)
    graph = build([writ_langchain_read_tool("ticket", deps), writ_langchain_tool(tag_spec, deps)], script, InMemorySaver())
    done = asyncio.run(graph.ainvoke({"messages": [HumanMessage("Tag it vip")]}, {"configurable": {"thread_id": f"conv-t-{uid}"}}))
    tags = outputs(done["messages"], "tag_ticket")
    assert [t["status"] for t in tags] == ["conflict", "applied"], tags
    assert tags[0]["current"]["version"] == '"v2"' and tags[0]["your_change"] == [{"op": "replace", "path": "/tags", "value": ["billing", "vip"]}]
    assert tags[1]["version"] == '"v3"' and tags[1]["duplicate"] is False
    assert done["messages"][-1].content == "tag: applied"
    assert records.read("ticket", tid)["state"]["tags"] == ["billing", "chargeback-risk", "vip"]


def test_without_a_thread_or_a_run_id_the_tool_refuses_rather_than_invent_one(client: WritClient) -> None:
    deps = WritDeps(client=client, read=lambda e: {"state": {"refunds": []}, "version": '"v1"'})
    node = ToolNode([writ_langchain_tool(refund_spec, deps)])
    graph_free = StateGraph(MessagesState)
    graph_free.add_node("tools", node)
    graph_free.add_edge(START, "tools")
    graph = graph_free.compile()
    with pytest.raises(ValueError, match="no run id"):
        graph.invoke({"messages": [call("refund_payment", {"paymentId": "pay_x", "amountCents": 100, "reason": "late"})]})
    with pytest.raises(ValueError, match="record_type"):
        writ_langchain_read_tool("", deps)


def test_the_example_prints_one_refund_against_the_session_stack(stack: Stack, owner: ChildProcess, records_server: ChildProcess, topics: dict[str, str]) -> None:
    lines = run_example_against(stack, records_server, topics, "writ_client.examples.langgraph_refund")
    assert any("interrupted for approval" in line for line in lines), lines
    assert any("duplicate: the ledger's stored reply" in line for line in lines), lines


def run_tool(tool: Any, message: AIMessage, thread_id: Any) -> Any:
    """One call run by a ToolNode in a graph with a checkpointer, in thread ``thread_id`` (None: no thread, no checkpointer)."""
    graph_free = StateGraph(MessagesState)
    graph_free.add_node("tools", ToolNode([tool]))
    graph_free.add_edge(START, "tools")
    graph = graph_free.compile(checkpointer=InMemorySaver() if thread_id is not None else None)
    return asyncio.run(graph.ainvoke({"messages": [message]}, {"configurable": {"thread_id": thread_id}} if thread_id is not None else None))


def one_refund(thread_id: Any, deps: WritDeps, **options: Any) -> Any:
    """A refund call run by a ToolNode in a graph with a checkpointer, in thread ``thread_id``."""
    return run_tool(writ_langchain_tool(refund_spec, deps, **options), call("refund_payment", {"paymentId": "pay_1", "amountCents": 500, "reason": "late"}), thread_id)


def test_a_numeric_thread_id_is_the_run_and_any_other_non_string_is_refused() -> None:
    """Passed over, a thread id of 42 fell back to WritDeps.run_id: the same refund in threads 42 and 43 was one
    intent, the second answered as a repeat and never written."""
    client, read = AppliedClient(), CountingReader()
    deps = WritDeps(client=client, read=read, run_id="process-run")  # type: ignore[arg-type]
    one_refund(42, deps)
    one_refund(43, deps)
    # As LangGraph keys the thread (str()), a float as JavaScript prints it (the TypeScript adapter's run for 44).
    one_refund(44.0, deps)
    one_refund(uuid.UUID("12345678-1234-5678-1234-567812345678"), deps)
    assert [i.run_id for i in client.submitted] == ["42", "43", "44", "12345678-1234-5678-1234-567812345678"]
    for bad, kind in ((("conv", 7), "tuple"), (True, "bool")):
        with pytest.raises(RunIdInvalid, match=rf"configurable.thread_id must be a string, a number or a UUID \(it is {kind}\)"):
            one_refund(bad, deps)
    assert len(client.submitted) == 4


def test_a_thread_id_longer_than_an_intent_carries_ends_the_run_naming_it_before_any_read() -> None:
    """On the old code the record was read, then the intent failed at encoding, and the ToolNode handed that
    ValidationError to the model as its arguments' fault ("Please fix the error"): it cannot fix the thread id."""
    client, read = AppliedClient(), CountingReader()
    deps = WritDeps(client=client, read=read)  # type: ignore[arg-type]
    with pytest.raises(RunIdInvalid, match=r"configurable.thread_id must be a string of 1 to 256 characters \(it is 300 characters\)"):
        one_refund("t" * 300, deps)
    with pytest.raises(RunIdInvalid, match=r"step_id\(params\) must be a string"):
        one_refund("t1", deps, step_id=lambda p: "s" * 300)
    assert (read.reads, client.submitted) == ([], [])


def one_read(thread_id: Any, deps: WritDeps) -> Any:
    """A read call run by a ToolNode, in thread ``thread_id`` (None: no thread)."""
    return run_tool(writ_langchain_read_tool("payment", deps), call("get_payment", {"id": "pay_1"}), thread_id)


def test_the_read_tool_refuses_a_run_id_no_intent_can_carry_naming_where_it_came_from() -> None:
    """As the write tool (and TypeScript's writLangChainReadTool): on the old code the record was read, and the model
    went on from it to a write that failed. A read with no run id at all is served."""
    client, read = AppliedClient(), CountingReader()
    with pytest.raises(RunIdInvalid, match=r"configurable.thread_id must be a string of 1 to 256 characters \(it is 300 characters\)"):
        one_read("t" * 300, WritDeps(client=client, read=read))  # type: ignore[arg-type]
    with pytest.raises(RunIdInvalid, match=r"WritDeps.run_id must be a string of 1 to 256 characters \(it is 300 characters\)"):
        one_read(None, WritDeps(client=client, read=read, run_id="r" * 300))  # type: ignore[arg-type]
    with pytest.raises(RunIdInvalid, match=r"configurable.thread_id must be a string, a number or a UUID \(it is tuple\)"):
        one_read(("conv", 7), WritDeps(client=client, read=read))  # type: ignore[arg-type]
    assert read.reads == []
    one_read(None, WritDeps(client=client, read=read))  # type: ignore[arg-type]
    one_read("t" * 256, WritDeps(client=client, read=read))  # type: ignore[arg-type]
    assert len(read.reads) == 2


def test_a_step_id_function_s_0_is_refused_naming_it_and_only_none_is_the_default_step() -> None:
    """On the old code 0 (falsy) fell back to WritDeps.step_id or the default step, while 1 was refused: step 0 of an
    intent was answered as a repeat of the call without one. As TypeScript: only None is not set."""
    client, read = AppliedClient(), CountingReader()
    for step in (0, 1):
        with pytest.raises(RunIdInvalid, match=r"step_id\(params\) must be a string of 1 to 256 characters \(it is int\)"):
            one_refund("t1", WritDeps(client=client, read=read), step_id=lambda p, step=step: step)  # type: ignore[arg-type]
    assert (read.reads, client.submitted) == ([], [])
    one_refund("t1", WritDeps(client=client, read=read, step_id=None))  # type: ignore[arg-type]
    assert [i.step_id for i in client.submitted] == ["once-per-run"]
