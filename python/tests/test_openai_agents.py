"""The OpenAI Agents SDK adapter in the SDK's own runner (its ScriptedModel, RunState), against the TypeScript
owner, counted at the records server (its own Idempotency-Key dedupe off): approval, then two resumes from the same
older saved state, each in a fresh process's shoes (the state restored from its string), and a retry of the whole
turn under new tool-call ids, written once; a conflict the model decides again."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from agents import Agent, RunState, Runner, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from writ_client import WritClient
from writ_client.devstack import RecordsAdmin
from writ_client.examples.demo_specs import refund_spec, tag_spec
from writ_client.openai_agents import writ_agent_read_tool, writ_agent_tool

from .scripted_client import AppliedClient, CountingReader

# No trace export: nothing here talks to OpenAI.
set_tracing_disabled(True)


def last_output(call: Any) -> tuple[str | None, dict[str, Any] | None]:
    """The tool name and the parsed output of the latest tool result in the model's input, if any."""
    items = call.input if isinstance(call.input, list) else []
    names = {i.get("call_id"): i.get("name") for i in items if isinstance(i, dict) and i.get("type") == "function_call"}
    outs = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
    if not outs:
        return None, None
    return names.get(outs[-1].get("call_id")), json.loads(outs[-1]["output"])


def scripted(respond: Callable[[str | None, dict[str, Any] | None], Any]) -> ScriptedModel:
    """A model whose every turn is ``respond(last tool, its output)``: a list of output items."""
    return ScriptedModel([ModelStep.respond(lambda call: list(respond(*last_output(call))))] * 50)


def calls(name: str, args: dict[str, Any]) -> Any:
    # A fresh call id each turn, as a model re-planning gives one.
    return [function_call(name, args, call_id=f"call_{uuid.uuid4().hex[:12]}")]


def test_approval_then_two_resumes_from_the_older_saved_state_write_one_refund(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid = f"pay_oa_{uid}"
    records.seed("payment", pid, {"customer": "c-79", "amountCents": 12000, "currency": "EUR", "refunds": []})
    read = lambda e: records.read(e.type, e.id)  # noqa: E731

    def respond(tool: str | None, out: dict[str, Any] | None) -> Any:
        if tool is None:
            return calls("read_record", {"type": "payment", "id": pid})
        if tool == "read_record":
            return calls("refund_payment", {"paymentId": pid, "amountCents": 5000, "reason": "damaged", "note": None})
        return [assistant_message(f"refund: {out and out['status']}" + (" (duplicate)" if out and out.get("duplicate") else ""))]

    agent = Agent(
        name="billing",
        instructions="Refund what the customer asks for.",
        model=scripted(respond),
        tools=[writ_agent_read_tool(["payment"], read=read), writ_agent_tool(refund_spec, client=client, read=read, needs_approval=True)],
    )

    async def flow() -> tuple[Any, list[Any]]:
        first = await Runner.run(agent, f"My order {pid} arrived broken. Please refund 50 EUR.", context={"runId": f"conv-{uid}"})
        saved = first.to_state().to_string()  # what a harness stores while a person decides
        resumes = []
        for _ in range(2):  # both from the same, older, saved state, restored from its string
            state = await RunState.from_string(agent, saved)
            state.approve(state.get_interruptions()[0])
            resumes.append(await Runner.run(agent, state))
        # The harness retries the whole turn (same conversation): the model re-plans under new tool-call ids.
        retry = await Runner.run(agent, f"My order {pid} arrived broken. Please refund 50 EUR.", context={"runId": f"conv-{uid}"})
        state = retry.to_state()
        assert state.get_interruptions()[0].raw_item.call_id != first.interruptions[0].raw_item.call_id
        state.approve(state.get_interruptions()[0])
        resumes.append(await Runner.run(agent, state))
        return first, resumes

    first, resumes = asyncio.run(flow())
    [asked] = first.interruptions
    assert asked.raw_item.name == "refund_payment", asked
    # The base the approver saw is pinned in the run context before the run stopped.
    [pinned] = first.context_wrapper.context["writ"]["bases"].values()
    assert pinned["version"] == '"v1"'
    texts = [r.final_output for r in resumes]
    assert texts == ["refund: applied", "refund: applied (duplicate)", "refund: applied (duplicate)"], texts
    # Measured at the records server: one refund, one PATCH for the intent key.
    assert records.read("payment", pid)["state"]["refunds"] == [{"amountCents": 5000, "reason": "damaged"}]
    key = client.intent_key(tool=refund_spec.tool, run_id=f"conv-{uid}", step_id="once-per-run", entity={"type": "payment", "id": pid}, params={"paymentId": pid, "amountCents": 5000, "reason": "damaged"})
    assert records.patch_requests(key) == 1


def test_a_conflict_goes_back_to_the_model_which_decides_again(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    tid = f"T-oa-{uid}"
    records.seed("ticket", tid, {"subject": "Charged twice", "status": "open", "tags": ["billing"]})
    seen: list[dict[str, Any]] = []

    def respond(tool: str | None, out: dict[str, Any] | None) -> Any:
        if tool is None:
            return calls("read_record", {"type": "ticket", "id": tid})
        assert out is not None
        if tool == "read_record":
            # Someone else tags the ticket after the agent read it.
            records.seed("ticket", tid, {"subject": "Charged twice", "status": "open", "tags": ["billing", "chargeback-risk"]})
        else:
            seen.append(out)
        if out["status"] in ("read", "conflict"):
            return calls("tag_ticket", {"ticketId": tid, "tag": "vip"})
        return [assistant_message(f"tag: {out['status']}")]

    read = lambda e: records.read(e.type, e.id)  # noqa: E731
    agent = Agent(name="support", model=scripted(respond), tools=[writ_agent_read_tool(["ticket"], read=read), writ_agent_tool(tag_spec, client=client, read=read)])
    result = asyncio.run(Runner.run(agent, "Tag it vip", context={"runId": f"conv-t-{uid}"}))
    assert [t["status"] for t in seen] == ["conflict", "applied"], seen
    assert seen[0]["current"]["version"] == '"v2"' and seen[0]["your_change"] == [{"op": "replace", "path": "/tags", "value": ["billing", "vip"]}]
    assert seen[1]["version"] == '"v3"' and seen[1]["duplicate"] is False
    assert result.final_output == "tag: applied"
    assert records.read("ticket", tid)["state"]["tags"] == ["billing", "chargeback-risk", "vip"]


def test_without_a_run_id_the_tool_ends_the_run_rather_than_invent_one(client: WritClient) -> None:
    read = lambda e: {"state": {"refunds": []}, "version": '"v1"'}  # noqa: E731

    def respond(tool: str | None, out: dict[str, Any] | None) -> Any:
        return calls("refund_payment", {"paymentId": "pay_x", "amountCents": 100, "reason": "late", "note": None}) if tool is None else [assistant_message("done")]

    agent = Agent(name="billing", model=scripted(respond), tools=[writ_agent_tool(refund_spec, client=client, read=read)])
    with pytest.raises(Exception, match="no run id"):
        asyncio.run(Runner.run(agent, "refund", context={}))
    with pytest.raises(ValueError, match="record_types"):
        writ_agent_read_tool([], read=read)


def unit_agent(respond: Callable[[str | None, dict[str, Any] | None], Any], client: Any, read: Any, **tool: Any) -> Agent:
    return Agent(name="billing", model=scripted(respond), tools=[writ_agent_read_tool(["payment"], read=read), writ_agent_tool(refund_spec, client=client, read=read, **tool)])


@pytest.mark.parametrize("approval", [False, True])
def test_arguments_that_do_not_match_the_tool_are_answered_for_the_model_to_fix(approval: bool) -> None:
    """On the old code the run ended (UserError) on a refund of 0 cents, a refund without its `reason` (with
    approval: while the SDK asked whether to approve them), JSON that does not parse and a read of an id no record
    can carry; a resume met them again. Now each is answered `rejected` / `invalid_params`, nothing read or sent, and the
    corrected call goes through."""
    client, read = AppliedClient(), CountingReader()
    wrong: list[Any] = [
        ("refund_payment", {"paymentId": "pay_1", "amountCents": 0, "reason": "late", "note": None}),
        ("refund_payment", {"paymentId": "pay_1", "amountCents": 500, "note": None}),
        ("read_record", {"type": "payment", "id": "\U0001f600" * 200}),
    ]
    if not approval:
        # (The SDK asks for approval of JSON it cannot parse without asking the tool.)
        wrong.insert(2, ("refund_payment", "{not json"))
    answers: list[dict[str, Any]] = []

    def respond(tool: str | None, out: dict[str, Any] | None) -> Any:
        if out is not None:
            answers.append(out)
        if wrong:
            name, args = wrong.pop(0)
            return [function_call(name, args, call_id=f"call_{uuid.uuid4().hex[:12]}")]
        if out is not None and out["status"] == "rejected":
            return calls("refund_payment", {"paymentId": "pay_1", "amountCents": 500, "reason": "late", "note": None})
        return [assistant_message(f"refund: {out and out['status']}")]

    result = asyncio.run(Runner.run(unit_agent(respond, client, read, needs_approval=approval), "refund", context={"runId": "conv-1"}))
    assert [(a["status"], a.get("reason")) for a in answers[: 3 if approval else 4]] == [("rejected", "invalid_params")] * (3 if approval else 4), answers
    assert "amountCents" in answers[0]["message"] and "reason" in answers[1]["message"] and "Fix them" in answers[0]["instruction"]
    if approval:
        assert [i.raw_item.name for i in result.interruptions] == ["refund_payment"]  # the corrected call, and only it
    else:
        assert result.final_output == "refund: applied"
        assert len(client.submitted) == 1


@pytest.mark.parametrize(("context", "got"), [({"runId": "r" * 300}, "300 characters"), ({"runId": 4242}, "int")])
def test_a_run_id_no_intent_can_carry_ends_the_run_naming_it_before_any_read(context: dict[str, Any], got: str) -> None:
    client, read = AppliedClient(), CountingReader()

    def respond(tool: str | None, out: dict[str, Any] | None) -> Any:
        return calls("refund_payment", {"paymentId": "pay_1", "amountCents": 500, "reason": "late", "note": None}) if tool is None else [assistant_message("done")]

    with pytest.raises(Exception, match=rf"context\['runId'\] must be a string of 1 to 256 characters \(it is {got}\)"):
        asyncio.run(Runner.run(unit_agent(respond, client, read), "refund", context=context))
    assert (read.reads, client.submitted) == ([], [])


def test_a_step_id_function_s_0_is_refused_naming_it_and_only_none_is_the_default_step() -> None:
    """On the old code 0 (falsy) was taken for "no step id", while 1 was refused: step 0 of an intent was answered as a
    repeat of the call without one. As TypeScript's ``stepId``: only None is not set."""
    client, read = AppliedClient(), CountingReader()

    def respond(tool: str | None, out: dict[str, Any] | None) -> Any:
        return calls("refund_payment", {"paymentId": "pay_1", "amountCents": 500, "reason": "late", "note": None}) if tool is None else [assistant_message("done")]

    for step in (0, 1):
        with pytest.raises(Exception, match=r"step_id\(context, params\) must be a string of 1 to 256 characters \(it is int\)"):
            asyncio.run(Runner.run(unit_agent(respond, client, read, step_id=lambda c, p, step=step: step), "refund", context={"runId": "conv-1"}))
    assert (read.reads, client.submitted) == ([], [])
    asyncio.run(Runner.run(unit_agent(respond, client, read, step_id=lambda c, p: None), "refund", context={"runId": "conv-1"}))
    asyncio.run(Runner.run(unit_agent(respond, client, read, step_id=lambda c, p: "0"), "refund", context={"runId": "conv-1"}))
    assert [i.step_id for i in client.submitted] == ["once-per-run", "0"]
