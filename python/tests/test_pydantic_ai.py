"""The Pydantic AI adapter: approval, then two resumes from the same older saved state, written once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from pydantic import TypeAdapter
from pydantic_ai import Agent, DeferredToolRequests, ModelMessagesTypeAdapter
from pydantic_ai.messages import ToolReturnPart

from writ_client import WritClient
from writ_client.devstack import ChildProcess, RecordsAdmin, Stack
from writ_client.examples.demo_specs import refund_spec
from writ_client.examples.refund import scripted_model
from writ_client.pydantic_ai import WritDeps, approval_results, recall_versions, to_model_result, writ_read_tool, writ_tool
from writ_client.tools import RunIdInvalid

from .conftest import REPO, run_example_against
from .scripted_client import AppliedClient, CountingReader


def refund_returns(messages: list[Any]) -> list[dict[str, Any]]:
    return [p.content for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart) and p.tool_name == "refund_payment"]


def test_approval_then_two_resumes_from_the_older_saved_history_write_one_refund(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid = f"pay_ai_{uid}"
    records.seed("payment", pid, {"customer": "c-77", "amountCents": 12000, "currency": "EUR", "refunds": []})
    read = lambda e: records.read(e.type, e.id)  # noqa: E731
    agent = Agent(
        scripted_model(pid),
        tools=[writ_read_tool(["payment"]), writ_tool(refund_spec, requires_approval=True)],
        deps_type=WritDeps,
        output_type=[str, DeferredToolRequests],
    )

    async def flow() -> tuple[DeferredToolRequests, list[list[dict[str, Any]]], str]:
        turn1 = await agent.run(f"My order {pid} arrived broken. Please refund 50 EUR.", deps=WritDeps(client=client, read=read, timeout=30))
        assert isinstance(turn1.output, DeferredToolRequests), turn1.output
        # Saved while waiting for the person: the messages and the approval request, as JSON (a process may end here).
        saved_messages = turn1.all_messages_json()
        saved_requests = TypeAdapter(DeferredToolRequests).dump_json(turn1.output)
        outputs = []
        for _ in range(2):  # both from the same, older, saved state; each in a fresh harness (empty deps)
            requests = TypeAdapter(DeferredToolRequests).validate_json(saved_requests)
            turn = await agent.run(
                message_history=ModelMessagesTypeAdapter.validate_json(saved_messages),
                deferred_tool_results=approval_results(requests),
                deps=WritDeps(client=client, read=read, timeout=30),
            )
            outputs.append(refund_returns(turn.new_messages()))
            last_text = turn.output
        return turn1.output, outputs, last_text

    requests, outputs, last_text = asyncio.run(flow())

    # The model called the refund tool; approval was requested, with the base the approver saw pinned.
    assert [c.tool_name for c in requests.approvals] == ["refund_payment"]
    call = requests.approvals[0]
    meta = requests.metadata[call.tool_call_id]["writ"]
    assert meta["base"]["version"] == '"v1"'
    assert call.args_as_dict()["amountCents"] == 5000
    # Resume 1 wrote; resume 2 got the ledger's stored answer.
    assert [len(o) for o in outputs] == [1, 1]
    first, second = outputs[0][0], outputs[1][0]
    assert (first["status"], first["duplicate"]) == ("applied", False), first
    assert (second["status"], second["duplicate"]) == ("applied", True), second
    assert first["version"] == second["version"] == '"v2"'
    assert "already been made" in last_text
    # Measured at the records server: one refund, one PATCH for the intent key.
    payment = records.read("payment", pid)
    assert payment["state"]["refunds"] == [{"amountCents": 5000, "reason": "damaged"}]
    assert records.patch_requests(meta["intentKey"]) == 1


def test_the_example_prints_one_refund_against_the_session_stack(stack: Stack, owner: ChildProcess, records_server: ChildProcess, topics: dict[str, str]) -> None:
    lines = run_example_against(stack, records_server, topics, "writ_client.examples.refund")
    assert any("duplicate: the ledger's stored reply" in line for line in lines), lines


def test_the_example_starts_what_it_needs(stack: Stack) -> None:
    env = {**os.environ, "KAFKA_BROKERS": stack.brokers, "SCHEMA_REGISTRY_URL": stack.registry_url, "WRIT_EXAMPLE_START": "1"}
    out = subprocess.run([sys.executable, "-m", "writ_client.examples.refund"], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == '{"refunds_created":1}', out.stdout
    assert "started a records server and one owner" in out.stdout


def test_model_results_and_recalled_versions() -> None:
    from writ_client import AppliedReply, UnknownOutcome

    applied = AppliedReply.model_validate(
        {"status": "applied", "intentId": "i", "intentKey": "k", "duplicate": True, "at": "t", "entity": {"type": "payment", "id": "p"}, "state": None, "version": '"v2"', "via": "patch"}
    )
    assert to_model_result(applied)["instruction"].startswith("This write had already been applied")
    assert to_model_result(UnknownOutcome(intent_id="i", intent_key="k", message="m"))["status"] == "unknown"
    deps = WritDeps(client=None)  # type: ignore[arg-type]
    recall_versions(
        deps,
        [
            {"status": "read", "entity": {"type": "payment", "id": "p"}, "record": {"refunds": []}, "version": '"v1"'},
            {"status": "applied", "duplicate": False, "entity": {"type": "payment", "id": "p"}, "record": {"refunds": [1]}, "version": '"v2"'},
            {"status": "applied", "duplicate": True, "entity": {"type": "payment", "id": "p"}, "record": None, "version": '"v2"'},
            "not a dict",
        ],
    )
    assert deps.versions == {"payment:p": {"state": {"refunds": [1]}, "version": '"v2"'}}
    json.dumps(deps.versions)  # plain JSON, to keep with a run's saved state


def test_a_conflict_goes_back_to_the_model_which_decides_again(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from writ_client.examples.demo_specs import tag_spec

    tid = f"T-{uid}"
    records.seed("ticket", tid, {"subject": "Charged twice", "status": "open", "tags": ["billing"]})
    calls = iter(range(100))

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = [p for p in getattr(messages[-1], "parts", []) if isinstance(p, ToolReturnPart)]
        if not last:
            return ModelResponse(parts=[ToolCallPart("read_record", {"type": "ticket", "id": tid}, tool_call_id="call_read")])
        out = last[-1].content
        if last[-1].tool_name == "read_record":
            # Someone else tags the ticket after the agent read it.
            records.seed("ticket", tid, {"subject": "Charged twice", "status": "open", "tags": ["billing", "chargeback-risk"]})
        if out["status"] in ("read", "conflict"):
            return ModelResponse(parts=[ToolCallPart("tag_ticket", {"ticketId": tid, "tag": "vip"}, tool_call_id=f"call_tag_{next(calls)}")])
        return ModelResponse(parts=[TextPart(f"tag: {out['status']}")])

    agent = Agent(FunctionModel(respond), tools=[writ_read_tool(["ticket"]), writ_tool(tag_spec)], deps_type=WritDeps)
    read = lambda e: records.read(e.type, e.id)  # noqa: E731
    result = asyncio.run(agent.run("Tag it vip", deps=WritDeps(client=client, read=read, timeout=30)))
    tags = [p.content for m in result.all_messages() for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart) and p.tool_name == "tag_ticket"]
    assert [t["status"] for t in tags] == ["conflict", "applied"], tags
    assert tags[0]["current"]["version"] == '"v2"' and tags[0]["your_change"] == [{"op": "replace", "path": "/tags", "value": ["billing", "vip"]}]
    assert tags[1]["version"] == '"v3"' and tags[1]["duplicate"] is False
    assert result.output == "tag: applied"
    assert records.read("ticket", tid)["state"]["tags"] == ["billing", "chargeback-risk", "vip"]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ({"run_id": 4242}, r"WritDeps.run_id must be a string of 1 to 256 characters \(it is int\)"),
        ({"run_id": "r" * 300}, r"WritDeps.run_id must be a string of 1 to 256 characters \(it is 300 characters\)"),
        ({"run_id": "conv-1", "step_id": "s" * 300}, r"WritDeps.step_id must be a string of 1 to 256 characters"),
        # Taken for "no step id" (falsy) on the old code: steps 0 and 1 of one intent were one write and the default.
        ({"run_id": "conv-1", "step_id": 0}, r"WritDeps.step_id must be a string of 1 to 256 characters \(it is int\)"),
        ({"run_id": "conv-1", "step_id": ""}, r"WritDeps.step_id must be a string of 1 to 256 characters \(it is 0 characters\)"),
    ],
)
def test_a_run_or_step_id_no_intent_can_carry_ends_the_run_naming_it_before_any_read(ids: dict[str, Any], message: str) -> None:
    """On the old code the record was read, then the intent failed at encoding with a ValidationError, which Pydantic AI
    handed to the model as its own arguments' fault: it cannot fix the harness's id."""
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("refund_payment", {"paymentId": "pay_1", "amountCents": 500, "reason": "late"}, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("done")])

    client, read = AppliedClient(), CountingReader()
    agent = Agent(FunctionModel(respond), tools=[writ_tool(refund_spec)], deps_type=WritDeps)
    with pytest.raises(RunIdInvalid, match=message):
        asyncio.run(agent.run("refund", deps=WritDeps(client=client, read=read, **ids)))  # type: ignore[arg-type]
    assert (read.reads, client.submitted) == ([], [])


def test_a_step_id_function_s_0_is_refused_naming_it_and_only_none_is_the_default_step() -> None:
    """On the old code a step-id function's 0 (falsy) fell back to WritDeps.step_id or the default step, while its 1
    was refused: step 0 of an intent was answered as a repeat of the call without a step id. As TypeScript's
    OpenAI Agents ``stepId``."""
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("refund_payment", {"paymentId": "pay_1", "amountCents": 500, "reason": "late"}, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("done")])

    client, read = AppliedClient(), CountingReader()
    for step in (0, 1):
        agent = Agent(FunctionModel(respond), tools=[writ_tool(refund_spec, step_id=lambda ctx, p, step=step: step)], deps_type=WritDeps)  # type: ignore[misc]
        with pytest.raises(RunIdInvalid, match=r"step_id\(ctx, params\) must be a string of 1 to 256 characters \(it is int\)"):
            asyncio.run(agent.run("refund", deps=WritDeps(client=client, read=read, run_id="conv-1", step_id="harness-step")))  # type: ignore[arg-type]
    assert (read.reads, client.submitted) == ([], [])
    agent = Agent(FunctionModel(respond), tools=[writ_tool(refund_spec, step_id=lambda ctx, p: None)], deps_type=WritDeps)
    asyncio.run(agent.run("refund", deps=WritDeps(client=client, read=read, run_id="conv-1")))  # type: ignore[arg-type]
    assert [i.step_id for i in client.submitted] == ["once-per-run"]


def test_the_read_tool_refuses_a_run_or_step_id_no_intent_can_carry_naming_it() -> None:
    """As the write tool: on the old code the record was read, and the model went on from it to a write that failed."""
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("read_record", {"type": "payment", "id": "pay_1"}, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("done")])

    client, read = AppliedClient(), CountingReader()
    agent = Agent(FunctionModel(respond), tools=[writ_read_tool(["payment"], read=read)], deps_type=WritDeps)
    for ids, message in (({"run_id": "r" * 300}, r"WritDeps.run_id must be a string of 1 to 256 characters"), ({"run_id": "conv-1", "step_id": 0}, r"WritDeps.step_id must be a string")):
        with pytest.raises(RunIdInvalid, match=message):
            asyncio.run(agent.run("read", deps=WritDeps(client=client, read=read, **ids)))  # type: ignore[arg-type]
    assert read.reads == []
    asyncio.run(agent.run("read", deps=WritDeps(client=client, read=read, run_id="r" * 256)))  # type: ignore[arg-type]
    assert len(read.reads) == 1
