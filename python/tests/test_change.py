"""Changes that span records from Python, against the TypeScript owner (demo tools): the saga under leases, counted
at the records server (its own Idempotency-Key dedupe off)."""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace
from typing import Any

from writ_client import (
    AppliedReply,
    ChangeApplied,
    ChangeCompensated,
    ChangeIncomplete,
    ChangeInput,
    ChangeNotStarted,
    ChangeStep,
    KeyedTool,
    RejectedReply,
    WritClient,
    change_id,
)
from writ_client.change import build_lease_intent
from writ_client.devstack import RecordsAdmin
from writ_client.models import EntityRef, UnknownOutcome

from .test_client import REFUND, TAG, seed_payment

NOTE = KeyedTool(name="note_account", key_scope="run", intent_fields=("ref",), record_type="account")


def three_records(records: RecordsAdmin, uid: str) -> tuple[str, str, str]:
    pid, tid, aid = f"pay_c_{uid}", f"T-c-{uid}", f"acct-{uid}"
    seed_payment(records, pid)
    records.seed("ticket", tid, {"subject": "Parcel damaged", "status": "open", "tags": ["billing"]})
    records.seed("account", aid, {"name": "Customer", "notes": []})
    return pid, tid, aid


def steps(pid: str, tid: str, aid: str, *, note_text: str = "Refunded 25.00 EUR") -> list[ChangeStep]:
    refund = {"amountCents": 2500, "reason": "damaged"}
    return [
        ChangeStep("refund", REFUND, {"type": "payment", "id": pid}, refund, [{"op": "add", "path": "/refunds/-", "value": refund}]),
        # built on the record as the change's lease read it
        ChangeStep("tag", TAG, {"type": "ticket", "id": tid}, {"tag": "refunded"}, lambda current: [{"op": "replace", "path": "/tags", "value": [*current.state["tags"], "refunded"]}]),
        ChangeStep("note", NOTE, {"type": "account", "id": aid}, {"ref": f"resolve-{aid}", "text": note_text}, [{"op": "add", "path": "/notes/-", "value": {"ref": f"resolve-{aid}", "text": note_text}}]),
    ]


def test_a_change_over_three_records_is_applied_whole_and_resumes_from_the_ledger(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid, tid, aid = three_records(records, uid)
    change = ChangeInput(run_id=f"run-{uid}", step_id="resolve", steps=steps(pid, tid, aid))
    result = client.change(change)
    assert isinstance(result, ChangeApplied), result
    assert result.change == change_id(agent_id=client.agent_id, run_id=f"run-{uid}", step_id="resolve")
    assert [r.duplicate for r in result.steps] == [False, False, False]
    assert records.read("payment", pid)["state"]["refunds"] == [{"amountCents": 2500, "reason": "damaged"}]
    assert records.read("ticket", tid)["state"]["tags"] == ["billing", "refunded"]
    assert [n["ref"] for n in records.read("account", aid)["state"]["notes"]] == [f"resolve-{aid}"]
    # Called again with the same input (a harness resuming after a crash): the same change, its steps repeats.
    again = client.change(change)
    assert isinstance(again, ChangeApplied) and [r.duplicate for r in again.steps] == [True, True, True], again
    assert [r.intent_key for r in again.steps] == [r.intent_key for r in result.steps]
    assert [records.patch_requests(r.intent_key) for r in result.steps] == [1, 1, 1]


def test_a_step_that_is_refused_undoes_the_steps_before_it(client: WritClient, records: RecordsAdmin, uid: str) -> None:
    pid, tid, aid = three_records(records, uid)
    # The note's text is over the tool's 500 characters: the owner refuses the third step (params_invalid).
    result = client.change(ChangeInput(run_id=f"run-{uid}", step_id="resolve", steps=steps(pid, tid, aid, note_text="x" * 501)))
    assert isinstance(result, ChangeCompensated), result
    assert result.failed_step == "note" and isinstance(result.result, RejectedReply) and result.result.reason == "params_invalid"
    assert len(result.undone) == 2 and all(isinstance(u, AppliedReply) and u.undo_of for u in result.undone)
    # Nothing of the change is left: the refund reversed (the tool's undo), the tag taken off, no note.
    payment = records.read("payment", pid)["state"]
    assert len(payment["refunds"]) == 1 and [r["amountCents"] for r in payment["reversals"]] == [2500]
    assert records.read("ticket", tid)["state"]["tags"] == ["billing"]
    assert records.read("account", aid)["state"]["notes"] == []
    assert [records.patch_requests(u.intent_key) for u in result.undone] == [1, 1]


def test_another_agents_write_to_a_leased_record_waits_for_the_release(client: WritClient, plain_client: WritClient, records: RecordsAdmin, uid: str) -> None:
    tid = f"T-l-{uid}"
    seeded = records.seed("ticket", tid, {"subject": "Leased", "status": "open", "tags": []})
    entity = EntityRef(type="ticket", id=tid)
    change = change_id(agent_id=client.agent_id, run_id=f"run-{uid}", step_id="hold")

    def lease(op: Any) -> Any:
        return build_lease_intent(change=change, op=op, entity=entity, tool="tag_ticket", agent_id=client.agent_id, run_id=f"run-{uid}", step_id=f"hold/{op}", reply_to=client.reply_topic, ttl_ms=60_000)

    held = client.submit(lease("acquire"), timeout=30)
    assert isinstance(held, AppliedReply) and held.via == "lease" and held.lease and held.lease["change"] == change, held
    write = {"tool": TAG, "entity": entity, "run_id": "run-other", "step_id": "s1", "base_version": seeded["version"], "delta": [{"op": "replace", "path": "/tags", "value": ["late"]}], "params": {"tag": "late"}}
    refused = plain_client.submit(write, timeout=30, on_leased="answer")
    assert isinstance(refused, RejectedReply) and refused.reason == "leased", refused
    assert records.read("ticket", tid)["state"]["tags"] == []
    # Waiting (the default): refused while the lease holds, submitted again until it is released, then applied.
    seen_leased = threading.Event()
    stream = plain_client.replies(idle_timeout=60)
    outcome: list[Any] = []
    waiter = threading.Thread(target=lambda: outcome.append(plain_client.submit(write, timeout=60)))
    waiter.start()
    for reply in stream:
        if reply.intent_key == refused.intent_key and reply.intent_id != refused.intent_id and isinstance(reply, RejectedReply) and reply.reason == "leased":
            seen_leased.set()
            break
    stream.close()
    assert seen_leased.is_set()
    released = client.submit(lease("release"), timeout=30)
    assert isinstance(released, AppliedReply) and released.lease and released.lease.get("released") is True, released
    waiter.join(timeout=90)
    assert outcome and isinstance(outcome[0], AppliedReply) and outcome[0].duplicate is False, outcome
    assert records.read("ticket", tid)["state"]["tags"] == ["late"]
    assert records.patch_requests(refused.intent_key) == 1


def test_leases_are_taken_in_utf16_code_unit_order_of_entity_keys_as_the_typescript_client_takes_them() -> None:
    # Wire contract §8.7: every client takes a change's leases in ascending entity-key order compared as UTF-16 code
    # units (JavaScript's sort), so that a Python change and a TypeScript one over the same records never wait on
    # each other in a cycle. U+1F600 (D83D DE00) comes before U+FF5A there, after it by code point.
    client = WritClient(brokers="127.0.0.1:1", agent_id="a", reply_topic="writ.replies.a")
    leases: list[tuple[str, str]] = []

    def submit(intent: Any, *, timeout: Any = None, on_leased: Any = "wait") -> Any:
        base = {"intentId": intent.intent_id, "intentKey": intent.intent_key, "duplicate": False, "at": "2026-01-01T00:00:00.000Z"}
        if intent.lease is not None and intent.lease.op in ("acquire", "release"):
            leases.append((intent.lease.op, intent.entity.id))
            return AppliedReply.model_validate({**base, "status": "applied", "entity": intent.entity.model_dump(), "state": {}, "version": '"v1"', "via": "lease"})
        return RejectedReply.model_validate({**base, "status": "rejected", "reason": "params_invalid", "message": "m"})

    client.submit = submit  # type: ignore[method-assign]
    tool = KeyedTool(name="t", key_scope="run", intent_fields=())
    result = client.change(ChangeInput(run_id="r", step_id="s", steps=[
        ChangeStep("first", tool, {"type": "t", "id": "\uff5a"}, {}, [{"op": "add", "path": "/a", "value": 1}]),
        ChangeStep("second", tool, {"type": "t", "id": "\U0001f600"}, {}, [{"op": "add", "path": "/a", "value": 1}]),
    ]))
    assert isinstance(result, ChangeCompensated)
    assert [id_ for op, id_ in leases if op == "acquire"] == ["\U0001f600", "\uff5a"]


def test_a_wait_that_is_not_a_number_of_seconds_is_refused_naming_it_before_anything_is_sent() -> None:
    # Every acquire answered `leased`: a wait whose deadline is NaN would never run out (asked again without end).
    client = WritClient(brokers="127.0.0.1:1", agent_id="a", reply_topic="writ.replies.a")
    sent: list[Any] = []

    def submit(intent: Any, *, timeout: Any = None, on_leased: Any = "wait") -> Any:
        sent.append(intent)
        base = {"intentId": intent.intent_id, "intentKey": intent.intent_key, "duplicate": False, "at": "2026-01-01T00:00:00.000Z"}
        return RejectedReply.model_validate({**base, "status": "rejected", "reason": "leased", "message": "m"})

    client.submit = submit  # type: ignore[method-assign]
    tool = KeyedTool(name="t", key_scope="run", intent_fields=())
    step = ChangeStep("only", tool, {"type": "t", "id": "1"}, {}, [{"op": "add", "path": "/a", "value": 1}])
    for field, value in [("wait_for_lease", float("nan")), ("wait_for_lease", -1.0), ("settle_within", float("nan")), ("settle_within", float("inf"))]:
        try:
            client.change(ChangeInput(run_id="r", step_id="s", steps=[step], **{field: value}))
        except ValueError as err:
            assert field in str(err)
        else:
            raise AssertionError(f"{field}={value} was taken")
    assert sent == []


def _scripted_change_client(refuse: Any) -> tuple[WritClient, list[Any]]:
    """A client whose owners are a script (no broker): ``refuse(intent)`` gives a rejection reason (or reason and
    details, or ``"unknown"``: no answer), else applied (with the fields of a dict it gives, e.g. ``undoneBy``)."""
    client = WritClient(brokers="127.0.0.1:1", agent_id="a", reply_topic="writ.replies.a")
    sent: list[Any] = []

    def submit(intent: Any, *, timeout: Any = None, on_leased: Any = "wait") -> Any:
        sent.append(intent)
        base = {"intentId": intent.intent_id, "intentKey": intent.intent_key, "duplicate": False, "at": "2026-01-01T00:00:00.000Z"}
        reason = refuse(intent)
        if reason == "unknown":
            return UnknownOutcome(intent_id=intent.intent_id, intent_key=intent.intent_key, message="no reply")
        details = None
        extra = reason if isinstance(reason, dict) else {}
        if isinstance(reason, dict):
            reason = None
        if isinstance(reason, tuple):
            reason, details = reason
        if reason is not None:
            return RejectedReply.model_validate({**base, "status": "rejected", "reason": reason, "message": reason, "details": details})
        lease = intent.lease is not None and intent.lease.op in ("acquire", "release")
        undo = {"undoOf": intent.undo.intent_key} if intent.undo is not None else {}
        return AppliedReply.model_validate({**base, "status": "applied", "entity": intent.entity.model_dump(), "state": {}, "version": '"v1"', "via": "lease" if lease else "patch", **undo, **extra})

    client.submit = submit  # type: ignore[method-assign]
    return client, sent


def _trace(sent: list[Any]) -> list[str]:
    return [f"{'undo' if i.undo is not None else i.lease.op} {i.entity.id}" for i in sent]


def test_a_renewal_past_the_longest_hold_stops_the_change_and_its_undos_run_under_the_lease_still_held(monkeypatch: Any) -> None:
    # A clock of the script's: each step or undo takes 0.6 s of a 1 s lease, so every lease is renewed before the next.
    import writ_client.change as change_module

    clock = [1000.0]
    monkeypatch.setattr(change_module, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=lambda s: None))
    acquires: dict[str, int] = {}

    def refuse(i: Any) -> str | None:
        if i.lease is not None and i.lease.op == "step":
            clock[0] += 0.6
        if i.lease is None or i.lease.op != "acquire":
            return None
        acquires[i.entity.id] = acquires.get(i.entity.id, 0) + 1
        # T-1's second renewal (before the third step) is past the longest hold owners allow.
        return "lease_hold_exceeded" if i.entity.id == "T-1" and acquires["T-1"] >= 3 else None

    client, sent = _scripted_change_client(refuse)
    tool = KeyedTool(name="t", key_scope="run", intent_fields=())
    steps_ = [ChangeStep(id_, tool, {"type": "ticket", "id": id_}, {}, [{"op": "add", "path": "/a", "value": 1}]) for id_ in ("T-3", "T-1", "T-2")]
    result = client.change(ChangeInput(run_id="r", step_id="s", steps=steps_, lease_ttl=1.0))
    assert isinstance(result, ChangeCompensated), result
    assert result.failed_step == "T-2" and isinstance(result.result, RejectedReply) and result.result.reason == "lease_hold_exceeded"
    # Refused once: the other leases renewed, T-2 never written, the steps undone (T-1's under its lease still held),
    # T-1 never asked again, every lease released.
    assert _trace(sent)[3:] == [
        *["step T-3", "acquire T-1", "acquire T-2", "acquire T-3", "step T-1", "acquire T-1", "acquire T-2", "acquire T-3"],
        *["undo T-1", "acquire T-2", "acquire T-3", "undo T-3", "release T-1", "release T-2", "release T-3"],
    ]


def test_an_acquire_past_the_agents_lease_limit_ends_the_change_not_started_releasing_what_it_took() -> None:
    client, sent = _scripted_change_client(lambda i: "lease_limit" if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2" else None)
    tool = KeyedTool(name="t", key_scope="run", intent_fields=())
    steps_ = [ChangeStep(id_, tool, {"type": "ticket", "id": id_}, {}, [{"op": "add", "path": "/a", "value": 1}]) for id_ in ("T-3", "T-1", "T-2")]
    result = client.change(ChangeInput(run_id="r", step_id="s", steps=steps_))
    assert isinstance(result, ChangeNotStarted), result
    assert isinstance(result.result, RejectedReply) and result.result.reason == "lease_limit"
    assert _trace(sent) == ["acquire T-1", "acquire T-2", "release T-1"]


def _three_steps() -> list[ChangeStep]:
    tool = KeyedTool(name="t", key_scope="run", intent_fields=())
    return [ChangeStep(id_, tool, {"type": "ticket", "id": id_}, {}, [{"op": "add", "path": "/a", "value": 1}]) for id_ in ("T-3", "T-1", "T-2")]


def test_a_resumed_change_whose_lease_is_refused_lease_hold_exceeded_before_its_first_step_ends_incomplete_never_not_started() -> None:
    # Its earlier run applied T-3 and lost T-1's answer; resumed, the owner still holds its lease of T-2 past the
    # longest hold: it ran, so its steps may stand ("nothing was written" would be false).
    expires_at = "2026-01-01T00:05:00.000Z"

    def refuse(i: Any) -> Any:
        if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
            return ("lease_hold_exceeded", {"acquiredAt": "2026-01-01T00:00:00.000Z", "maxHoldMs": 1000, "expiresAt": expires_at})
        return None

    client, sent = _scripted_change_client(refuse)
    result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps()))
    assert isinstance(result, ChangeIncomplete), result
    assert result.applied == ["T-3", "T-1", "T-2"] and expires_at in result.message
    assert isinstance(result.result, RejectedReply) and result.result.reason == "lease_hold_exceeded"
    assert _trace(sent) == ["acquire T-1", "acquire T-2", "release T-1"]


def test_a_change_this_client_left_incomplete_resumed_while_a_record_is_leased_or_at_the_lease_limit_ends_incomplete_a_new_client_does_not_know() -> None:
    for reason in ("leased", "lease_limit"):
        resumed = [False]

        def refuse(i: Any, reason: str = reason) -> Any:
            if not resumed[0] and i.lease is not None and i.lease.op == "step" and i.entity.id == "T-1":
                return "unknown"
            if resumed[0] and i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
                return reason
            return None

        client, sent = _scripted_change_client(refuse)
        first = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), settle_within=0))
        assert isinstance(first, ChangeIncomplete) and first.applied == ["T-3"], first
        resumed[0] = True
        before = len(sent)
        again = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
        assert isinstance(again, ChangeIncomplete) and again.applied == ["T-3"], (reason, again)
        assert isinstance(again.result, RejectedReply) and again.result.reason == reason
        assert not [t for t in _trace(sent[before:]) if t.startswith("step")]
        # Another client (the agent restarted after a crash) has no memory of it.
        fresh, _ = _scripted_change_client(lambda i, reason=reason: reason if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2" else None)
        assert isinstance(fresh.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0)), ChangeNotStarted)


def test_a_client_started_anew_whose_acquire_is_refused_held_before_ends_incomplete_never_not_started_and_without_it_not_started(monkeypatch: Any) -> None:
    import re

    import writ_client.change as change_module

    monkeypatch.setattr(change_module, "time", SimpleNamespace(monotonic=change_module.time.monotonic, sleep=lambda s: None))
    cases: list[tuple[str, dict[str, Any]]] = [
        ("leased", {"expiresAt": "2026-01-01T00:01:00.000Z"}),
        ("lease_limit", {"held": 64, "max": 64}),
        ("lease_cooldown", {"until": "2026-01-01T00:00:10.000Z", "change": "f" * 64}),
        # A resume whose clock is behind the crashed run's: its acquire predates the lapsed lease's mark.
        ("lease_replayed", {}),
    ]
    for reason, details in cases:

        def told(i: Any, reason: str = reason, details: dict[str, Any] = details) -> Any:
            if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
                return (reason, {**details, "heldBefore": True})
            return None

        client, sent = _scripted_change_client(told)
        result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
        assert isinstance(result, ChangeIncomplete), (reason, result)
        assert result.applied == ["T-3", "T-1", "T-2"] and re.search(r"held its records before.*may have written", result.message), result
        assert isinstance(result.result, RejectedReply) and result.result.reason == reason
        assert [t for t in _trace(sent) if not t.startswith("acquire")] == ["release T-1"], reason
        # Any value but absent, null or false counts (bytes from Kafka are hostile: read as absent, the unsafe answer).
        for odd in ("true", 1, 0, "", {"heldBefore": True}):

            def hostile(i: Any, reason: str = reason, details: dict[str, Any] = details, odd: Any = odd) -> Any:
                if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
                    return (reason, {**details, "heldBefore": odd})
                return None

            told_odd, _ = _scripted_change_client(hostile)
            answer = told_odd.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
            assert isinstance(answer, ChangeIncomplete) and answer.applied == ["T-3", "T-1", "T-2"], (reason, odd, answer)
        # The control: the same refusal without it, or with null or false.
        for absent in ("absent", None, False):

            def plain(i: Any, reason: str = reason, details: dict[str, Any] = details, absent: Any = absent) -> Any:
                if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
                    return (reason, dict(details) if absent == "absent" else {**details, "heldBefore": absent})
                return None

            fresh, _ = _scripted_change_client(plain)
            answer = fresh.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
            assert isinstance(answer, ChangeNotStarted), (reason, absent, answer)
    # Said while the record was waited for: known, even when the last refusal does not say it.
    refusals = [0]

    def waited(i: Any) -> Any:
        if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
            refusals[0] += 1
            return ("leased", {"heldBefore": True} if refusals[0] == 1 else {})
        return None

    client, _ = _scripted_change_client(waited)
    result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0.3))
    assert isinstance(result, ChangeIncomplete) and result.applied == ["T-3", "T-1", "T-2"], result
    assert refusals[0] > 1


def test_a_client_started_anew_whose_granted_acquire_says_held_before_ends_incomplete_at_a_later_refusal_without_it() -> None:
    # The refused record's mark is gone (a record keeps its latest marks only); the granted one's says it (any value but
    # absent, null or false).
    import re

    for said in (True, "absent", "true", 1, None, False):

        def script(i: Any, said: Any = said) -> Any:
            if i.lease is None or i.lease.op != "acquire":
                return None
            if i.entity.id == "T-1":
                return {"lease": {"change": i.lease.change, "expiresAt": "2026-01-01T00:01:00.000Z", **({} if said == "absent" else {"heldBefore": said})}}
            if i.entity.id == "T-2":
                return ("leased", {"expiresAt": "2026-01-01T00:01:00.000Z"})
            return None

        client, sent = _scripted_change_client(script)
        result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
        if said not in ("absent", None, False):
            assert isinstance(result, ChangeIncomplete), (said, result)
            assert result.applied == ["T-3", "T-1", "T-2"] and re.search(r"held its records before.*may have written", result.message), result
        else:
            assert isinstance(result, ChangeNotStarted) and result.entity.id == "T-2", (said, result)
        assert [t for t in _trace(sent) if not t.startswith("acquire")] == ["release T-1"], said


def test_a_change_this_client_saw_not_started_is_not_started_again_when_a_refusal_says_held_before() -> None:
    # First run: T-2 leased to another change (T-1 taken and released). Again: T-1 taken by that change, which the
    # owner says this change held before (its mark from the release): nothing of it stands all the same.
    again = [False]

    def script(i: Any) -> Any:
        if i.lease is None or i.lease.op != "acquire":
            return None
        if not again[0] and i.entity.id == "T-2":
            return "leased"
        if again[0] and i.entity.id == "T-1":
            return ("leased", {"heldBefore": True})
        return None

    client, sent = _scripted_change_client(script)
    first = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
    assert isinstance(first, ChangeNotStarted) and first.entity.id == "T-2", first
    assert [t for t in _trace(sent) if not t.startswith("acquire")] == ["release T-1"]
    again[0] = True
    second = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
    assert isinstance(second, ChangeNotStarted) and second.entity.id == "T-1", second


def _grant(i: Any, held_before: Any = True) -> dict[str, Any]:
    """An acquire's grant (the script's applied reply) whose lease says ``heldBefore``."""
    return {"lease": {"change": i.lease.change, "expiresAt": "2026-01-01T00:01:00.000Z", "heldBefore": held_before}}


def test_the_memory_of_a_not_started_run_speaks_only_for_the_records_it_took_held_before_of_another_ends_incomplete() -> None:
    # A client started anew resumes a change another process ran (a step on T-1) and crashed in. Run 1: T-1 leased
    # to another change, no heldBefore (that mark pushed off): not started, nothing taken. Run 2: T-1 granted, T-2
    # refused with heldBefore (the crashed process's mark): not this client's run's.
    import re

    run = [1]

    def script(i: Any) -> Any:
        if i.lease is None or i.lease.op != "acquire":
            return None
        if run[0] == 1 and i.entity.id == "T-1":
            return "leased"
        if run[0] == 2 and i.entity.id == "T-2":
            return ("leased", {"heldBefore": True})
        return None

    client, _ = _scripted_change_client(script)
    first = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
    assert isinstance(first, ChangeNotStarted) and first.entity.id == "T-1", first
    run[0] = 2
    result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
    assert isinstance(result, ChangeIncomplete) and result.applied == ["T-3", "T-1", "T-2"], result
    assert isinstance(result.result, RejectedReply) and result.result.reason == "leased"
    assert re.search(r"held its records before.*may have written", result.message), result

    # The control: marks on records this client's not_started runs took (with those of every such run remembered).
    again = [1]

    def own(i: Any) -> Any:
        if i.lease is None or i.lease.op != "acquire":
            return None
        if again[0] == 1 and i.entity.id == "T-2":
            return "leased"  # took T-1
        if again[0] == 2 and i.entity.id == "T-1":
            return _grant(i)
        if again[0] == 2 and i.entity.id == "T-3":
            return "leased"  # took T-1 and T-2
        if again[0] == 3 and i.entity.id == "T-1":
            return _grant(i)
        if again[0] == 3 and i.entity.id == "T-2":
            return ("leased", {"heldBefore": True})
        return None

    mine, _ = _scripted_change_client(own)
    for n, entity in ((1, "T-2"), (2, "T-3"), (3, "T-2")):
        again[0] = n
        got = mine.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
        assert isinstance(got, ChangeNotStarted) and got.entity.id == entity, (n, got)


def test_a_run_that_raises_before_any_step_is_built_is_remembered_not_started_with_the_records_it_took() -> None:
    # Called again, a grant saying heldBefore on one of them and a refusal on another is not started; not when that
    # run was itself told heldBefore, or lease_cooldown naming the change.
    from writ_client.client import IntentRefused

    def broken_delta(current: Any) -> Any:
        raise RuntimeError("the harness's delta broke")

    # The delta function of the first step (T-3) raises; or the last acquire (T-3) is not sent: T-1 and T-2 taken.
    raisers: list[tuple[str, Any, list[str]]] = [("delta function", None, ["T-1", "T-2", "T-3"]), ("too_large", IntentRefused("too_large", "not sent"), ["T-1", "T-2"])]
    for what, error, took in raisers:
        for told in ("nothing", "heldBefore", "lease_cooldown"):
            resumed = [False]
            cooled = [False]

            def script(i: Any, error: Any = error, told: str = told, resumed: list[bool] = resumed, cooled: list[bool] = cooled) -> Any:
                if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-1":
                    if resumed[0] or told == "heldBefore":
                        return _grant(i)
                    if told == "lease_cooldown" and not cooled[0]:
                        cooled[0] = True
                        return ("lease_cooldown", {"until": "2026-01-01T00:00:10.000Z", "change": i.lease.change})
                if resumed[0] and i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
                    return "leased"
                if not resumed[0] and error is not None and i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-3":
                    raise error
                return None

            client, sent = _scripted_change_client(script)
            steps_ = [dataclasses.replace(s, delta=broken_delta) if what == "delta function" and s.name == "T-3" else s for s in _three_steps()]
            try:
                client.change(ChangeInput(run_id="r", step_id="s", steps=steps_, wait_for_lease=1.0))
            except Exception:  # noqa: BLE001 - what each raiser raises
                pass
            else:
                raise AssertionError(f"{what} {told}: the change did not raise")
            assert [t for t in _trace(sent) if t.startswith("release")] == [f"release {k}" for k in took], (what, told)
            resumed[0] = True
            result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
            if told == "nothing":
                assert isinstance(result, ChangeNotStarted) and result.entity.id == "T-2", (what, told, result)
            else:
                assert isinstance(result, ChangeIncomplete) and result.applied == ["T-3", "T-1", "T-2"], (what, told, result)


def test_held_before_said_of_a_record_after_the_runs_own_acquire_of_it_had_no_answer_is_counted() -> None:
    # An earlier run's mark may be the one said (unsure: incomplete). The fault: R0 took T-1 and T-2, wrote its step on
    # T-1 and crashed; its leases lapsed (marks); another change took T-2. A fresh client resumes: T-1's acquire is lost
    # (an owner failover), asked again it is granted saying heldBefore (R0's mark), T-2 refused leased until
    # wait_for_lease: not_started would hide R0's write. Said of another record, it counts too.
    for mark_on in ("T-1", "T-2"):
        lost = [0]

        def script(i: Any, mark_on: str = mark_on, lost: list[int] = lost) -> Any:
            if i.lease is None or i.lease.op != "acquire":
                return None
            if i.entity.id == "T-1":
                lost[0] += 1
                if lost[0] == 1:
                    return "unknown"
                return _grant(i) if mark_on == "T-1" else None
            if i.entity.id == "T-2":
                return ("leased", {"heldBefore": True} if mark_on == "T-2" else {})
            return None

        client, _ = _scripted_change_client(script)
        result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0.15))
        assert lost[0] == 2, mark_on
        assert isinstance(result, ChangeIncomplete) and result.applied == ["T-3", "T-1", "T-2"], (mark_on, result)


def test_a_grant_whose_held_before_is_not_a_boolean_is_read_by_parse_reply_and_counted_as_said() -> None:
    # Parity with the TypeScript client's reply schema (lease.heldBefore unchecked): the reply is read, its lease
    # granted and released, and any value but absent, null or false counts.
    from writ_client import parse_reply

    def script(i: Any) -> Any:
        if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
            return "leased"
        return None

    client, sent = _scripted_change_client(script)
    scripted_submit = client.submit

    def submit(intent: Any, **kw: Any) -> Any:
        got = scripted_submit(intent, **kw)
        if intent.lease is not None and intent.lease.op == "acquire" and intent.entity.id == "T-1" and isinstance(got, AppliedReply):
            wire = {**got.model_dump(by_alias=True, exclude_none=True), "lease": {"change": intent.lease.change, "expiresAt": "2026-01-01T00:01:00.000Z", "heldBefore": "true"}}
            got = parse_reply(wire)
            assert got.lease == wire["lease"]
        return got

    client.submit = submit  # type: ignore[method-assign]
    result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
    assert isinstance(result, ChangeIncomplete) and result.applied == ["T-3", "T-1", "T-2"], result
    assert [t for t in _trace(sent) if not t.startswith("acquire")] == ["release T-1"]


def test_the_memory_of_not_started_runs_never_overrides_a_refusal_lease_hold_exceeded_or_lease_cooldown_naming_the_change(monkeypatch: Any) -> None:
    import writ_client.change as change_module

    for refusal in ("lease_hold_exceeded", "lease_cooldown"):
        run = [1]

        def script(i: Any, refusal: str = refusal, run: list[int] = run) -> Any:
            if i.lease is None or i.lease.op != "acquire" or i.entity.id != "T-2":
                return None
            if run[0] == 1:
                return "leased"  # not started, T-1 taken (its mark this client's)
            return (refusal, {"until": "2026-01-01T00:00:10.000Z", "change": i.lease.change} if refusal == "lease_cooldown" else {"expiresAt": "2026-01-01T00:05:00.000Z"})

        client, _ = _scripted_change_client(script)
        first = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
        assert isinstance(first, ChangeNotStarted) and first.entity.id == "T-2", first
        run[0] = 2
        again = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
        assert isinstance(again, ChangeIncomplete) and again.applied == ["T-3", "T-1", "T-2"], (refusal, again)
        assert isinstance(again.result, RejectedReply) and again.result.reason == refusal
    # lease_cooldown naming the change in the first round, then leased to another change until wait_for_lease.
    monkeypatch.setattr(change_module, "time", SimpleNamespace(monotonic=change_module.time.monotonic, sleep=lambda s: None))
    refusals = [0]

    def waited(i: Any) -> Any:
        if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
            refusals[0] += 1
            return ("lease_cooldown", {"until": "2026-01-01T00:00:10.000Z", "change": i.lease.change}) if refusals[0] == 1 else "leased"
        return None

    client, _ = _scripted_change_client(waited)
    result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0.3))
    assert isinstance(result, ChangeIncomplete) and result.applied == ["T-3", "T-1", "T-2"], result
    assert isinstance(result.result, RejectedReply) and result.result.reason == "leased"
    assert refusals[0] > 1


def test_a_run_of_the_change_that_ends_not_started_never_replaces_what_another_run_on_the_client_remembered_incomplete(monkeypatch: Any) -> None:
    # The other run (another thread) ends incomplete while this one is between reading the memory and writing it: at
    # the first or second release of the memory's lock after this run's refusal.
    import writ_client.change as change_module
    from writ_client.change import _RunBefore

    for at in (1, 2):

        class Hooked:
            """The memory's lock, whose releases run ``hook`` once, at the ``at``-th release after it is armed."""

            def __init__(self) -> None:
                self.lock = threading.Lock()
                self.hook: Any = None
                self.exits = 0

            def __enter__(self) -> None:
                self.lock.acquire()

            def __exit__(self, *exc: Any) -> None:
                self.lock.release()
                if self.hook is not None:
                    self.exits += 1
                    if self.exits == at:
                        hook, self.hook = self.hook, None
                        hook()

        hooked = Hooked()
        monkeypatch.setattr(change_module, "_run_lock", hooked)

        def script(i: Any) -> Any:
            if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
                if hooked.exits == 0 and hooked.hook is None and not armed[0]:
                    armed[0] = True
                    hooked.hook = lambda: change_module._remember(client, change_id(agent_id="a", run_id="r", step_id="s"), _RunBefore("incomplete", standing=("T-3",)))
                return "leased"
            return None

        armed = [False]
        client, _ = _scripted_change_client(script)
        first = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
        assert isinstance(first, ChangeNotStarted), (at, first)
        assert hooked.hook is None, at
        again = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
        assert isinstance(again, ChangeIncomplete) and again.applied == ["T-3"], (at, again)


def test_a_resume_that_loses_a_lease_or_its_read_before_a_step_is_sent_ends_incomplete_nothing_undone(monkeypatch: Any) -> None:
    # Owners said heldBefore (or this client left the change incomplete): an earlier run's steps from that step on may
    # stand, so undoing only this run's would answer compensated over them. Not known to be a resume: compensated.
    import re

    import writ_client.change as change_module

    for held_before in (True, False):
        reads = [0]

        def script(i: Any, held_before: bool = held_before, reads: list[int] = reads) -> Any:
            if i.lease is None or i.lease.op != "acquire":
                return None
            if i.entity.id == "T-1":
                # The read before step T-1 (its acquire came back truncated) is refused: the lease lapsed, another change took it.
                reads[0] += 1
                return {**_grant(i, False), "truncated": True, "state": None} if reads[0] == 1 else "leased"
            if i.entity.id == "T-2":
                return _grant(i, True) if held_before else None
            return None

        client, sent = _scripted_change_client(script)
        result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), settle_within=0))
        if held_before:
            assert isinstance(result, ChangeIncomplete) and result.applied == ["T-3", "T-1", "T-2"], result
            assert isinstance(result.result, RejectedReply) and result.result.reason == "leased"
            assert re.search(r"ran before.*before step T-1 was sent.*nothing is undone", result.message), result.message
            # Nothing undone; the leases released (nothing of the run in flight; the marks they leave tell a resume).
            assert [t for t in _trace(sent) if not t.startswith("acquire")] == ["step T-3", "release T-1", "release T-2", "release T-3"]
            again = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
            assert isinstance(again, ChangeIncomplete) and again.applied == ["T-3", "T-1", "T-2"], again
        else:
            assert isinstance(result, ChangeCompensated) and result.failed_step == "T-1", result
            assert [t for t in _trace(sent) if not t.startswith("acquire")] == ["step T-3", "undo T-3", "release T-1", "release T-2", "release T-3"]
    # A renewal refused lease_hold_exceeded before step T-2 (each step takes 0.6 s of a 1 s lease), on a resume this
    # client knows of (it left the change incomplete: T-1's answer lost).
    clock = [1000.0]
    monkeypatch.setattr(change_module, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=lambda s: None))
    resumed = [False]
    acquires: dict[str, int] = {}

    def renewals(i: Any) -> Any:
        if i.lease is not None and i.lease.op == "step":
            clock[0] += 0.6
        if not resumed[0] and i.lease is not None and i.lease.op == "step" and i.entity.id == "T-1":
            return "unknown"
        if not resumed[0] or i.lease is None or i.lease.op != "acquire":
            return None
        acquires[i.entity.id] = acquires.get(i.entity.id, 0) + 1
        return "lease_hold_exceeded" if i.entity.id == "T-1" and acquires["T-1"] >= 3 else None

    client, sent = _scripted_change_client(renewals)
    first = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), lease_ttl=1.0, settle_within=0))
    assert isinstance(first, ChangeIncomplete) and first.applied == ["T-3"], first
    resumed[0] = True
    before = len(sent)
    result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), lease_ttl=1.0, settle_within=0))
    assert isinstance(result, ChangeIncomplete) and result.applied == ["T-3", "T-1", "T-2"], result
    assert isinstance(result.result, RejectedReply) and result.result.reason == "lease_hold_exceeded"
    assert "this client left it incomplete" in result.message
    assert [t for t in _trace(sent[before:]) if not t.startswith("acquire")] == ["step T-3", "step T-1", "release T-1", "release T-2", "release T-3"]
    # A step refused after it was sent on a resume keeps the compensation: owners answer an applied one as a repeat.
    told = [False]

    def refused(i: Any) -> Any:
        if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-1" and not told[0]:
            told[0] = True
            return ("leased", {"heldBefore": True})
        if i.lease is not None and i.lease.op == "step" and i.undo is None and i.entity.id == "T-2":
            return "patch_not_applicable"
        return None

    other, _ = _scripted_change_client(refused)
    compensated = other.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), settle_within=0))
    assert isinstance(compensated, ChangeCompensated) and compensated.failed_step == "T-2", compensated


def test_an_acquire_refused_lease_cooldown_is_waited_out_and_one_naming_this_change_ends_it_incomplete(monkeypatch: Any) -> None:
    import writ_client.change as change_module

    monkeypatch.setattr(change_module, "time", SimpleNamespace(monotonic=change_module.time.monotonic, sleep=lambda s: None))
    refusals = [2]

    def waited(i: Any) -> Any:
        if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2" and refusals[0] > 0:
            refusals[0] -= 1
            return ("lease_cooldown", {"until": "2026-01-01T00:00:10.000Z", "change": i.lease.change})
        return None

    client, sent = _scripted_change_client(waited)
    assert isinstance(client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps())), ChangeApplied)
    assert _trace(sent).count("acquire T-2") == 3
    for own in (True, False):

        def cooling(i: Any, own: bool = own) -> Any:
            if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
                return ("lease_cooldown", {"until": "2026-01-01T00:00:10.000Z", "change": i.lease.change if own else "f" * 64})
            return None

        other, _ = _scripted_change_client(cooling)
        result = other.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
        assert isinstance(result, ChangeIncomplete if own else ChangeNotStarted), (own, result)


def test_a_run_that_raises_after_a_step_was_sent_is_remembered_leases_left_to_expire_and_called_again_while_leased_ends_incomplete() -> None:
    from writ_client.client import ClientClosed, IntentRefused

    def broken_delta(current: Any) -> Any:
        raise RuntimeError("the harness's delta broke")

    raisers: list[tuple[str, Any, list[str]]] = [
        ("delta function", None, ["T-3"]),
        ("too_large", IntentRefused("too_large", "not sent"), ["T-3", "T-1"]),
        ("client_closed", ClientClosed(), ["T-3", "T-1"]),
    ]
    for what, error, standing in raisers:
        resumed = [False]

        def refuse(i: Any, error: Any = error) -> Any:
            if not resumed[0] and error is not None and i.lease is not None and i.lease.op == "step" and i.entity.id == "T-1":
                raise error
            if resumed[0] and i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
                return "leased"
            return None

        client, sent = _scripted_change_client(refuse)
        steps_ = [dataclasses.replace(s, delta=broken_delta) if what == "delta function" and s.name == "T-1" else s for s in _three_steps()]
        try:
            client.change(ChangeInput(run_id="r", step_id="s", steps=steps_))
        except Exception:  # noqa: BLE001 - what each raiser raises
            pass
        else:
            raise AssertionError(f"{what}: the change did not raise")
        # Its leases left to expire, as an incomplete change's are: a resume takes them again.
        assert not [t for t in _trace(sent) if t.startswith("release")], what
        resumed[0] = True
        again = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
        assert isinstance(again, ChangeIncomplete) and again.applied == standing, (what, again)
        assert isinstance(again.result, RejectedReply) and again.result.reason == "leased"


def test_a_run_that_raises_before_any_step_is_sent_releases_its_leases_and_called_again_while_leased_is_not_started() -> None:
    resumed = [False]
    client, sent = _scripted_change_client(lambda i: "leased" if resumed[0] and i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2" else None)

    def broken_delta(current: Any) -> Any:
        raise RuntimeError("the harness's delta broke")

    steps_ = [dataclasses.replace(s, delta=broken_delta) if s.name == "T-3" else s for s in _three_steps()]
    try:
        client.change(ChangeInput(run_id="r", step_id="s", steps=steps_))
    except RuntimeError as err:
        assert "delta broke" in str(err)
    else:
        raise AssertionError("the change did not raise")
    assert _trace(sent) == ["acquire T-1", "acquire T-2", "acquire T-3", "release T-1", "release T-2", "release T-3"]
    resumed[0] = True
    assert isinstance(client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0)), ChangeNotStarted)


def test_a_change_this_client_saw_applied_called_again_while_leased_is_answered_applied_and_one_it_saw_compensated_not_started() -> None:
    again = [False]
    client, _ = _scripted_change_client(lambda i: "leased" if again[0] and i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2" else None)
    first = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps()))
    assert isinstance(first, ChangeApplied), first
    again[0] = True
    repeat = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
    assert isinstance(repeat, ChangeApplied), repeat
    assert [(r.intent_key, r.duplicate, r.state) for r in repeat.steps] == [(r.intent_key, True, None) for r in first.steps]
    # Compensated after its hold ran out, called again within the cool-down: refused lease_cooldown naming it, yet
    # nothing of it stands.
    refuse = [False]

    def script(i: Any) -> Any:
        if not refuse[0] and i.lease is not None and i.lease.op == "step" and i.undo is None and i.entity.id == "T-2":
            return "patch_not_applicable"
        if refuse[0] and i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
            return ("lease_cooldown", {"until": "2026-01-01T00:00:10.000Z", "change": i.lease.change})
        return None

    other, _ = _scripted_change_client(script)
    assert isinstance(other.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps())), ChangeCompensated)
    refuse[0] = True
    result = other.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
    assert isinstance(result, ChangeNotStarted) and isinstance(result.result, RejectedReply) and result.result.reason == "lease_cooldown", result


def test_a_change_compensated_before_run_again_by_a_client_that_does_not_remember_it_ends_compensated_no_later_step_sent() -> None:
    # The owners answer the earlier run's key of T-3's step as its repeat: applied, and undone since.
    undone = {"duplicate": True, "state": None, "undoneBy": "undo-of-T-3"}
    client, sent = _scripted_change_client(lambda i: undone if i.lease is not None and i.lease.op == "step" and i.undo is None and i.entity.id == "T-3" else None)
    result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps()))
    assert isinstance(result, ChangeCompensated), result
    assert result.failed_step == "T-3" and isinstance(result.result, AppliedReply) and result.result.undone_by == "undo-of-T-3" and result.undone == []
    assert _trace(sent) == ["acquire T-1", "acquire T-2", "acquire T-3", "step T-3", "release T-1", "release T-2", "release T-3"]


def test_a_later_step_answered_undone_by_undoes_the_steps_this_run_applied_before_it_and_ends_compensated() -> None:
    undone = {"duplicate": True, "state": None, "undoneBy": "undo-of-T-1"}
    client, sent = _scripted_change_client(lambda i: undone if i.lease is not None and i.lease.op == "step" and i.undo is None and i.entity.id == "T-1" else None)
    result = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps()))
    assert isinstance(result, ChangeCompensated), result
    assert result.failed_step == "T-1" and [u.undo_of is not None for u in result.undone] == [True]
    assert _trace(sent)[3:] == ["step T-3", "step T-1", "undo T-3", "release T-1", "release T-2", "release T-3"]


def test_the_memory_is_bounded_by_the_steps_it_keeps_a_change_of_that_many_steps_pushes_an_older_one_out(monkeypatch: Any) -> None:
    import writ_client.change as change_module

    # 100,000 steps as the bound is, in a test's time: the bound made 1,000.
    monkeypatch.setattr(change_module, "_MAX_REMEMBERED_STEPS", 1_000)
    leased = [False]
    client, _ = _scripted_change_client(lambda i: "leased" if leased[0] and i.lease is not None and i.lease.op == "acquire" else None)
    small = ChangeInput(run_id="r", step_id="small", steps=_three_steps()[:1])
    assert isinstance(client.change(small), ChangeApplied)
    tool = KeyedTool(name="t", key_scope="run", intent_fields=())
    big = ChangeInput(run_id="r", step_id="big", steps=[ChangeStep(f"s{n}", tool, {"type": "ticket", "id": "T-1"}, {}, [{"op": "add", "path": "/a", "value": 1}]) for n in range(1_000)])
    assert isinstance(client.change(big), ChangeApplied)
    leased[0] = True
    # The big change is the latest: kept whatever it weighs. The small one was pushed out.
    assert isinstance(client.change(dataclasses.replace(big, wait_for_lease=0)), ChangeApplied)
    assert isinstance(client.change(dataclasses.replace(small, wait_for_lease=0)), ChangeNotStarted)


def test_a_keyboard_interrupt_after_a_step_was_sent_is_remembered_as_incomplete_like_any_error() -> None:
    resumed = [False]

    def refuse(i: Any) -> Any:
        if not resumed[0] and i.lease is not None and i.lease.op == "step" and i.entity.id == "T-1":
            raise KeyboardInterrupt
        if resumed[0] and i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
            return "leased"
        return None

    client, sent = _scripted_change_client(refuse)
    try:
        client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps()))
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the change did not raise")
    assert not [t for t in _trace(sent) if t.startswith("release")]
    resumed[0] = True
    again = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
    assert isinstance(again, ChangeIncomplete) and again.applied == ["T-3", "T-1"], again


def test_what_the_client_remembers_of_a_change_is_its_own_changing_a_result_it_returned_changes_no_later_answer() -> None:
    resumed = [False]

    def refuse(i: Any) -> Any:
        if not resumed[0] and i.lease is not None and i.lease.op == "step" and i.entity.id == "T-1":
            return "unknown"
        if resumed[0] and i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
            return "leased"
        return None

    client, _ = _scripted_change_client(refuse)
    first = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), settle_within=0))
    assert isinstance(first, ChangeIncomplete) and first.applied == ["T-3"], first
    first.applied[0] = "tampered"
    resumed[0] = True
    second = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
    assert isinstance(second, ChangeIncomplete) and second.applied == ["T-3"], second
    second.applied.clear()
    third = client.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
    assert isinstance(third, ChangeIncomplete) and third.applied == ["T-3"], third
    leased = [False]
    done, _ = _scripted_change_client(lambda i: "leased" if leased[0] and i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2" else None)
    applied = done.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps()))
    assert isinstance(applied, ChangeApplied)
    applied.steps[0].version = "tampered"
    leased[0] = True
    answered = done.change(ChangeInput(run_id="r", step_id="s", steps=_three_steps(), wait_for_lease=0))
    assert isinstance(answered, ChangeApplied) and [r.version for r in answered.steps] == ['"v1"', '"v1"', '"v1"'], answered


def test_another_run_of_the_change_that_ended_applied_meanwhile_makes_a_lost_read_end_incomplete_not_compensated() -> None:
    # Run B takes T-1 and T-2 (T-2's grant too large to come back: read again before its step); at B's step T-1, run
    # A, the same change, runs whole (applied, remembered); then B's read of T-2 is refused. B read its memory when its
    # leases were taken (empty): it must read it again at the stop, or it undoes T-1 and says compensated while A's
    # T-2 stands (the TypeScript client's twin test in test/unit/client/change.test.ts).
    tool = KeyedTool(name="t", key_scope="run", intent_fields=())
    two = ChangeInput(
        run_id="r", step_id="s", settle_within=0, steps=[ChangeStep(id_, tool, {"type": "ticket", "id": id_}, {}, [{"op": "add", "path": "/a", "value": 1}]) for id_ in ("T-1", "T-2")]
    )
    state: dict[str, Any] = {"t2": 0, "a_done": False, "a": None, "in_a": False}

    def refuse(i: Any) -> Any:
        if i.lease is not None and i.lease.op == "acquire" and i.entity.id == "T-2":
            state["t2"] += 1
            if state["a_done"]:
                return "leased"
            if state["t2"] == 1:
                return {"truncated": True, "state": None}
        if i.lease is not None and i.lease.op == "step" and i.entity.id == "T-1" and state["a"] is None and not state["in_a"]:
            state["in_a"] = True
            state["a"] = client.change(two)
            state["a_done"] = True
        return None

    client, sent = _scripted_change_client(refuse)
    result = client.change(two)
    assert isinstance(state["a"], ChangeApplied), state["a"]
    assert isinstance(result, ChangeIncomplete) and result.applied == ["T-1", "T-2"], result
    assert isinstance(result.result, RejectedReply) and result.result.reason == "leased"
    assert "another run of it on this client ended applied meanwhile" in result.message
    assert [t for t in _trace(sent) if t.startswith("undo")] == []
