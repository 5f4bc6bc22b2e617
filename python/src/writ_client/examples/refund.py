"""``python -m writ_client.examples.refund``: a refund through a Pydantic AI tool, with approval,
resumed twice from the same saved messages; written once.

No API key: the model is Pydantic AI's ``FunctionModel``, scripted to read
the payment, then ask for the refund. The broker, registry, records server and
owner are real.

Where it runs (environment):

* ``RECORDS_URL`` set (and ``WRIT_EXAMPLE_START`` not ``1``): against a running
  stack. ``KAFKA_BROKERS`` (required then), ``SCHEMA_REGISTRY_URL`` (optional:
  plain JSON without it), and an owner with the demo tools
  (``examples/demo-tools.ts``) reading ``WRIT_INTENTS_TOPIC`` (default
  ``writ.intents``) against that records server (a demo records server: the
  example seeds a payment through its ``/_admin/`` API).
* otherwise, or with ``WRIT_EXAMPLE_START=1``: from a checkout of the writ
  repository (found from the working dir, or ``WRIT_REPO``), it starts what it
  needs: the broker and registry (``KAFKA_BROKERS`` if set, else
  ``node scripts/kafka-up.ts``, which reuses a running local stack), a demo
  records server and one owner on topics of this run, and stops at the end
  what it started (the broker and registry only if they were not running).

The last line is one JSON object, measured at the records server:
``{"refunds_created":1}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests, ModelMessagesTypeAdapter
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from ..client import WritClient
from ..devstack import RecordsAdmin
from ..pydantic_ai import WritDeps, approval_results, writ_read_tool, writ_tool
from ._run import Say, count_refunds, run_example
from .demo_specs import refund_spec

__all__ = ["main", "refund_flow", "scripted_model"]


def scripted_model(payment_id: str, amount_cents: int = 5000) -> FunctionModel:
    """A model that reads before it writes: user message → read the payment; read result → refund; refund result → a sentence."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last: ToolReturnPart | None = None
        for part in getattr(messages[-1], "parts", []):
            if isinstance(part, ToolReturnPart):
                last = part
        if last is None:
            return ModelResponse(parts=[ToolCallPart("read_record", {"type": "payment", "id": payment_id}, tool_call_id="call_read_1")])
        if last.tool_name == "read_record":
            args = {"paymentId": payment_id, "amountCents": amount_cents, "reason": "damaged", "note": "Customer sent photos of the broken item."}
            return ModelResponse(parts=[ToolCallPart("refund_payment", args, tool_call_id="call_refund_1")])
        out = last.content if isinstance(last.content, dict) else {}
        if out.get("status") == "applied":
            text = "The refund is done" + (" (it had already been made)." if out.get("duplicate") else ".")
        else:
            text = f"The refund came back {out.get('status')}."
        return ModelResponse(parts=[TextPart(text)])

    return FunctionModel(respond)


def describe(output: Any) -> str:
    o = output if isinstance(output, dict) else {}
    if o.get("status") == "read":
        return f"read at {o.get('version')}, {len((o.get('record') or {}).get('refunds', []))} refund(s)"
    if o.get("status") == "applied":
        return f"applied at {o.get('version')}" + (" (duplicate: the ledger's stored reply, nothing written)" if o.get("duplicate") else "")
    return f"{o.get('status')}: {o.get('instruction')}"


def _tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]


async def refund_flow(client: WritClient, records: RecordsAdmin, payment_id: str, say: Say, *, timeout: float = 60) -> dict[str, Any]:
    """Turn 1 asks for approval; the saved state (messages + the approval request) is resumed twice, each time in a fresh harness."""
    read = lambda entity: records.read(entity.type, entity.id)  # noqa: E731
    agent = Agent(
        scripted_model(payment_id),
        tools=[writ_read_tool(["payment"]), writ_tool(refund_spec, requires_approval=True)],
        deps_type=WritDeps,
        output_type=[str, DeferredToolRequests],
    )
    say(f"turn 1: the customer asks for 50.00 EUR back on {payment_id} (item arrived damaged)")
    turn1 = await agent.run(f"My order {payment_id} arrived broken. Please refund 50 EUR.", deps=WritDeps(client=client, read=read, timeout=timeout))
    for part in _tool_returns(turn1.new_messages()):
        say(f"  model -> {part.tool_name}: {describe(part.content)}")
    if not isinstance(turn1.output, DeferredToolRequests):
        raise RuntimeError(f"expected an approval request, got {turn1.output!r}")
    requests = turn1.output
    for call in requests.approvals:
        say(f"  model -> {call.tool_name} {json.dumps(call.args_as_dict())}: approval requested")
    # What a harness stores while it waits for a person: the messages and the approval request (with writ's pinned base).
    saved_messages = turn1.all_messages_json()
    saved_requests = requests
    say("a person approves; the harness continues the run from the saved state")
    outputs = []
    for label in ("resume 1", "resume 2, from the same older saved state (as after a crash before resume 1's result was stored)"):
        say(f"  {label}:")
        history = ModelMessagesTypeAdapter.validate_json(saved_messages)
        turn = await agent.run(
            message_history=history, deferred_tool_results=approval_results(saved_requests), deps=WritDeps(client=client, read=read, timeout=timeout)
        )
        for part in _tool_returns(turn.new_messages()):
            say(f"    {part.tool_name} executed: {describe(part.content)}")
            if part.tool_name == "refund_payment":
                outputs.append(part.content)
        say(f"    model: {turn.output}")
    return {"refunds_created": count_refunds(records, payment_id, say), "outputs": outputs, "requests": requests}


def main() -> int:
    return run_example("Pydantic AI", "refund", refund_flow)


if __name__ == "__main__":
    sys.exit(main())
