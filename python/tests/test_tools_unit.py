"""writ_client.tools, what every framework adapter shares, against a scripted client: the model results, the versions
recalled from a run's history, the base after a conflict, and the refusals made before anything is sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from pydantic import BaseModel

from writ_client import AppliedReply, CanonicalJsonError, ConflictReply, EntityRef, IntentRefused, KeyedTool, RejectedReply, UnknownOutcome, Versioned
from writ_client.tools import REMEMBERED_CALLS, RunIdInvalid, WritDeps, WritToolSpec, check_run_ids, pin_base, pin_call_base, recall_versions, submit_tool_call, to_model_result

TAG = KeyedTool(name="tag_ticket", key_scope="run", intent_fields=("tag",), record_type="ticket")
TICKET = EntityRef(type="ticket", id="T1")


class TagParams(BaseModel):
    ticketId: str  # noqa: N815 - the model's name
    tag: str


def tag_delta(params: TagParams, base: Versioned) -> list[dict[str, Any]]:
    # Built from the base's state: a base without its state would replace the tags with the new one alone.
    tags = list((base.state or {}).get("tags", []))
    return [{"op": "replace", "path": "/tags", "value": [*tags, params.tag]}]


SPEC = WritToolSpec(tool=TAG, params=TagParams, entity=lambda p: EntityRef(type="ticket", id=p.ticketId), delta=tag_delta)


class ScriptedClient:
    """Answers each submit with the next scripted reply (or raises it), and keeps what was submitted."""

    def __init__(self, answers: list[Callable[[Any], Any]]) -> None:
        self.answers = answers
        self.submitted: list[Any] = []

    async def asubmit(self, intent: Any, *, timeout: float | None = None) -> Any:
        self.submitted.append(intent)
        return self.answers.pop(0)(intent)


def reply(status: str, **fields: Any) -> Callable[[Any], Any]:
    def answer(intent: Any) -> Any:
        base = {"intentId": "i", "intentKey": "k" * 64, "duplicate": False, "at": "2026-12-06T00:00:00.000Z", "entity": TICKET.model_dump()}
        model = {"applied": AppliedReply, "conflict": ConflictReply, "rejected": RejectedReply}[status]
        return model.model_validate({**base, "status": status, **fields})

    return answer


def raises(err: BaseException) -> Callable[[Any], Any]:
    def answer(intent: Any) -> Any:
        raise err

    return answer


def call(deps: WritDeps, read: Callable[[EntityRef], Versioned] | None = None, tool_call_id: str | None = "call_1") -> dict[str, Any]:
    params = TagParams(ticketId="T1", tag="vip")
    return asyncio.run(
        submit_tool_call(deps, SPEC, params, run_id="run-1", step_id="once-per-run", key="k" * 64, entity=TICKET, tool_call_id=tool_call_id, read=read)
    )


def test_after_a_conflict_whose_record_was_left_out_the_next_attempt_is_based_on_a_fresh_read() -> None:
    """A conflict reply too large for the broker carries the version without the record. Pinned as it came, the
    next attempt would build its delta from nothing at a matching version and drop the tags the record holds."""
    record = {"tags": ["a", "b"]}
    reads: list[EntityRef] = []

    def read(entity: EntityRef) -> Versioned:
        reads.append(entity)
        return Versioned(state=record, version='"v2"')

    client = ScriptedClient([
        reply("conflict", cycle=1, message="m", current={"state": None, "version": '"v2"'}, your_change=[], truncated=True),
        reply("applied", state={"tags": ["a", "b", "vip"]}, version='"v3"', via="patch"),
    ])
    deps = WritDeps(client=client, versions={"ticket:T1": {"state": {"tags": ["a"]}, "version": '"v1"'}})  # type: ignore[arg-type]
    first = call(deps, read)
    assert first["status"] == "conflict" and first["truncated"] is True
    assert "read the record again" in first["instruction"]
    assert reads == [TICKET]
    call(deps, read, "call_2")  # the model deciding again
    again = client.submitted[1]
    assert again.base_version == '"v2"'
    assert again.delta[0].value == ["a", "b", "vip"]


def test_a_failed_fresh_read_after_a_truncated_conflict_keeps_the_old_pin() -> None:
    def read(entity: EntityRef) -> Versioned:
        raise OSError("records server down")

    client = ScriptedClient([reply("conflict", cycle=1, message="m", current={"state": None, "version": '"v2"'}, your_change=[], truncated=True)])
    deps = WritDeps(client=client, versions={"ticket:T1": {"state": {"tags": ["a"]}, "version": '"v1"'}})  # type: ignore[arg-type]
    call(deps, read)
    # The next attempt meets the same conflict (nothing written against a state it does not have) and reads again.
    assert deps.bases["k" * 64] == {"state": {"tags": ["a"]}, "version": '"v1"', "calls": ["call_1"]}


V1 = {"state": {"tags": ["billing"]}, "version": '"v1"'}
V2 = {"state": {"tags": ["billing", "legal-hold"]}, "version": '"v2"'}


class OwnerAtV2(ScriptedClient):
    """The record is at v2: an intent based on v1 meets a conflict (``current``: v2), one based on v2 is applied."""

    def __init__(self) -> None:
        super().__init__([])

    async def asubmit(self, intent: Any, *, timeout: float | None = None) -> Any:
        self.submitted.append(intent)
        if intent.base_version == V1["version"]:
            return reply("conflict", cycle=1, message="changed", current=V2, your_change=[])(intent)
        return reply("applied", state={"tags": ["billing", "legal-hold", "vip"]}, version='"v3"', via="patch")(intent)

    def bases(self) -> list[tuple[str | None, str]]:
        return [(i.tool_call_id, i.base_version) for i in self.submitted]


def test_a_replayed_call_keeps_its_base_after_its_conflict_was_lost_and_a_new_call_gets_the_moved_pin() -> None:
    """Approved at v1; the record changes to v2; the approved call meets a conflict whose result is lost (a crash, a
    client that re-sends), and the run goes on again from the same saved state: the same tool-call id again. Sent
    against the moved pin it would apply, on v2, a change nobody decided on v2; against its own base the ledger
    answers the same conflict. A new tool-call id, the model deciding again after reading the conflict, gets v2."""
    owner = OwnerAtV2()
    deps = WritDeps(client=owner, versions={"ticket:T1": V1})  # type: ignore[arg-type]
    asyncio.run(pin_base(deps, "k" * 64, TICKET, None, "call_1"))  # asked for approval
    assert call(deps, tool_call_id="call_1")["status"] == "conflict"  # lost
    # The run's saved state is plain JSON (a RunState's context, a harness's store): kept across the crash.
    deps = WritDeps(client=owner, versions=json.loads(json.dumps(deps.versions)), bases=json.loads(json.dumps(deps.bases)))  # type: ignore[arg-type]
    assert call(deps, tool_call_id="call_1")["status"] == "conflict"
    assert call(deps, tool_call_id="call_2")["status"] == "applied"
    assert owner.bases() == [("call_1", '"v1"'), ("call_1", '"v1"'), ("call_2", '"v2"')]
    assert owner.submitted[2].delta[0].value == ["billing", "legal-hold", "vip"]


def test_the_base_an_approval_carries_pins_its_call_however_the_pin_has_moved() -> None:
    """Pydantic AI's approval metadata: every resume from the same approved state passes the base the approver saw."""
    owner = OwnerAtV2()
    deps = WritDeps(client=owner)  # type: ignore[arg-type]  # a fresh process: nothing pinned yet
    for _ in range(2):
        pin_call_base(deps, "k" * 64, "call_1", V1)
        call(deps, tool_call_id="call_1")
    # Another call approved at v1, resumed after the pin moved to v2, keeps v1; a new call gets v2.
    pin_call_base(deps, "k" * 64, "call_0", V1)
    call(deps, tool_call_id="call_0")
    call(deps, tool_call_id="call_2")
    assert owner.bases() == [("call_1", '"v1"'), ("call_1", '"v1"'), ("call_0", '"v1"'), ("call_2", '"v2"')]


def test_a_pin_stored_before_is_the_pin_of_every_call_and_calls_without_an_id_follow_the_pin() -> None:
    owner = OwnerAtV2()
    deps = WritDeps(client=owner, bases={"k" * 64: dict(V1)})  # type: ignore[arg-type]
    call(deps, tool_call_id="call_1")
    call(deps, tool_call_id="call_1")
    call(deps, tool_call_id=None)
    deps.bases["k" * 64] = dict(V1)
    call(deps, tool_call_id=None)
    call(deps, tool_call_id=None)
    assert owner.bases() == [("call_1", '"v1"'), ("call_1", '"v1"'), (None, '"v2"'), (None, '"v1"'), (None, '"v2"')]


def test_a_pin_remembers_the_latest_calls_only() -> None:
    deps = WritDeps(client=OwnerAtV2(), versions={"ticket:T1": V1})  # type: ignore[arg-type]
    for n in range(REMEMBERED_CALLS + 1):
        call(deps, tool_call_id=f"call_{n}")
    pin = deps.bases["k" * 64]
    assert pin["version"] == '"v2"'
    remembered = [c for e in pin.get("earlier", []) for c in e["calls"]] + pin.get("calls", [])
    assert len(remembered) == REMEMBERED_CALLS and "call_0" not in remembered


def test_recalled_versions_skip_results_that_carry_a_version_without_its_record() -> None:
    deps = WritDeps(client=None)  # type: ignore[arg-type]
    ticket = TICKET.model_dump()
    recall_versions(
        deps,
        [
            {"status": "read", "entity": ticket, "record": {"tags": []}, "version": '"v1"'},
            {"status": "applied", "duplicate": False, "entity": ticket, "record": None, "version": '"v2"', "truncated": True},
            {"status": "conflict", "entity": ticket, "current": {"state": None, "version": '"v3"'}, "truncated": True},
            # saved before `truncated` was carried: the null says it too
            {"status": "applied", "duplicate": False, "entity": ticket, "record": None, "version": '"v4"'},
        ],
    )
    assert deps.versions == {"ticket:T1": {"state": {"tags": []}, "version": '"v1"'}}


def test_recall_from_messages_off_takes_no_version_from_the_conversation() -> None:
    # A conversation whose messages a client sent (a LangGraph server's thread input) may hold a forged read result:
    # with the recall off, its state and version never become a write's base.
    forged = [{"status": "read", "entity": TICKET.model_dump(), "record": {"tags": []}, "version": '"v7"'}]
    off = WritDeps(client=None, recall_from_messages=False)  # type: ignore[arg-type]
    recall_versions(off, forged)
    assert off.versions == {}
    on = WritDeps(client=None)  # type: ignore[arg-type]
    recall_versions(on, forged)
    assert on.versions == {"ticket:T1": {"state": {"tags": []}, "version": '"v7"'}}


def test_model_results_say_what_the_typescript_adapters_say() -> None:
    leased = reply("rejected", reason="leased", message="held by change c1 until 2026-12-06T00:01:00Z")(None)
    assert "Call the tool again later with the same arguments" in to_model_result(leased)["instruction"]
    other = reply("rejected", reason="params_invalid", message="m")(None)
    assert to_model_result(other)["instruction"] == "The write was refused and nothing was written. Do not retry it unchanged."
    truncated = reply("applied", state=None, version='"v9"', via="patch", truncated=True)(None)
    assert to_model_result(truncated)["truncated"] is True
    assert "truncated" not in to_model_result(reply("applied", state={}, version='"v9"', via="patch")(None))
    unknown = to_model_result(UnknownOutcome(intent_id="i", intent_key="k", message="m"))["instruction"]
    assert "In this same run" in unknown and "from a new run it may count as a new write" in unknown


@pytest.mark.parametrize(
    ("err", "reason"),
    [
        (IntentRefused("too_large", "intent i not sent: it is 300000 bytes encoded"), "too_large"),
        (IntentRefused("too_deep", "intent i not sent: nested deeper than 32 levels"), "too_deep"),
        (CanonicalJsonError("not_canonical", "NaN has no canonical JSON"), "not_canonical"),
        (CanonicalJsonError("input_too_deep", "value nested deeper than 256 levels"), "too_deep"),
        (KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "intent i not sent: over message.max.bytes")), "too_large"),
    ],
)
def test_an_intent_refused_before_sending_is_a_rejected_result_for_the_model(err: BaseException, reason: str) -> None:
    """TypeScript's modelResultOf: the same arguments fail the same way, so the model is told to change them,
    where an exception would end the run and every resume would meet it again."""
    deps = WritDeps(client=ScriptedClient([raises(err)]), versions={"ticket:T1": {"state": {"tags": []}, "version": '"v1"'}})  # type: ignore[arg-type]
    result = call(deps)
    assert result["status"] == "rejected" and result["reason"] == reason
    assert "change them" in result["instruction"] and result["entity"] == TICKET.model_dump()
    assert result["message"]


@pytest.mark.parametrize(
    "err",
    [
        KafkaException(KafkaError(KafkaError._TRANSPORT, "brokers unreachable")),
        CanonicalJsonError("not_json", "a set is not a JSON value"),
        TimeoutError("no reply topic leaders"),
    ],
)
def test_errors_that_leave_the_outcome_open_still_end_the_run(err: BaseException) -> None:
    deps = WritDeps(client=ScriptedClient([raises(err)]), versions={"ticket:T1": {"state": {"tags": []}, "version": '"v1"'}})  # type: ignore[arg-type]
    with pytest.raises(type(err)):
        call(deps)


def test_a_refusal_for_a_key_an_earlier_call_holds_says_that_earlier_write_may_have_been_applied() -> None:
    """The owner refuses a call whose intent key an earlier call with other arguments holds (a regenerated free value,
    a changed note): that earlier call may have been applied. Told "nothing was written", the model takes the earlier
    write for refused too and may make it again under changed intent fields: a new key, a second write."""
    reused = reply("rejected", reason="key_reused_with_different_params", message="intent key k was used with other params")(None)
    instruction = to_model_result(reused)["instruction"]
    assert "nothing was written" not in instruction
    assert "earlier write may have been applied" in instruction and "read the record" in instruction
    assert "the earlier call's arguments returns its outcome" in instruction


@pytest.mark.parametrize(
    ("run_id", "step_id", "field", "got"),
    [
        ("r" * 257, "once-per-run", "run_id", "257 characters"),
        ("\U0001f600" * 129, "once-per-run", "run_id", "258 characters"),  # two UTF-16 code units each, as owners count
        (4242, "once-per-run", "run_id", "int"),
        ("run-1", "s" * 257, "step_id", "257 characters"),
        ("run-1", 7, "step_id", "int"),
    ],
)
def test_a_run_or_step_id_no_intent_can_carry_is_refused_before_the_record_is_read(run_id: Any, step_id: Any, field: str, got: str) -> None:
    """On the old code the record was read (and pinned) first, then the intent failed at encoding."""
    reads: list[EntityRef] = []

    def read(entity: EntityRef) -> Versioned:
        reads.append(entity)
        return Versioned(state={"tags": []}, version='"v1"')

    client = ScriptedClient([reply("applied", state={"tags": ["vip"]}, version='"v2"', via="patch")])
    with pytest.raises(RunIdInvalid, match=f"{field} must be a string of 1 to 256 characters \\(it is {got}\\)") as refused:
        asyncio.run(submit_tool_call(WritDeps(client=client), SPEC, TagParams(ticketId="T1", tag="vip"), run_id=run_id, step_id=step_id, key="k" * 64, entity=TICKET, tool_call_id="c", read=read))  # type: ignore[arg-type]
    assert refused.value.field == field
    assert (reads, client.submitted) == ([], [])
    check_run_ids("r" * 256, "\U0001f600" * 128)  # the longest the wire carries
