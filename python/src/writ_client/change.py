"""Changes that span records (TypeScript's ``client.change``, ``producers/change.ts``; docs/architecture.md §10).

A saga whose coordinator is the agent's own client, with leases held by the
records' owners so that no other write lands on a record between the change's
steps:

1. Each record's lease is taken through its owner, in entity-key order (two
   changes over the same records never wait on each other in a cycle).
2. Each step is an intent of its own (key from the change's run and step plus
   the step's name), built on the record as its lease acquire read it and
   marked as a step of the change: its owner refuses it unless the change holds
   the record's lease.
3. A step that is not applied triggers the declared undos of the steps already
   applied, newest first, under the same leases.
4. The leases are released; a lease the change does not release (its agent
   stalled or crashed) expires, and its owner counts it.

Every intent of a change has a key derived from the change, so calling
:meth:`WritClient.change` again with the same run and step resumes it after a
crash: the leases are the change's own again, and applied steps are answered
from the ledger. A resumed change whose lease is not taken again does not end
``not_started`` when it is known to have run (see :class:`ChangeNotStarted`):
by this client's memory, or by its owners (``heldBefore`` on an acquire's answer:
a refusal's ``details``, a grant's ``lease``; the change held the record before,
while the record keeps that mark: 15 minutes from its release, or for a lapse
from the lease's latest acquire by the agent's clock, and only among the
record's latest 64 marks; counted also after one of the run's own acquires of
the record had no answer, and whatever its value but absent, null or false:
unsure, ``incomplete``). This client's memory of its ``not_started`` runs (also
a run that raised before any step was built) overrides the owners' only when
``heldBefore`` is said only of records those runs took (the marks are their own
releases), never a refusal ``lease_hold_exceeded`` or ``lease_cooldown`` naming
the change. A run known so to be a resume whose lease is lost (or its read
refused) before a step is sent ends ``incomplete``, every step possibly
standing: compensating would undo only this run's steps, not the earlier run's
from that step on.
The wire form is the TypeScript client's, byte for byte
(``lease_intent_key``, ``change_id``; wire contract §5.8).
"""

from __future__ import annotations

import math
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Union

from .canonical import utf16_sort_key
from .keys import KeyedTool, change_id, entity_key, lease_intent_key
from .models import (
    DEFAULT_LEASE_TTL_MS,
    LEASE_VERSION,
    MAX_LEASE_TTL_MS,
    AgentRef,
    AppliedReply,
    EntityRef,
    IntentLease,
    RejectedReply,
    SubmitResult,
    Versioned,
    WriteIntent,
    iso_now,
)

if TYPE_CHECKING:
    from .client import WritClient

__all__ = ["ChangeApplied", "ChangeCompensated", "ChangeIncomplete", "ChangeInput", "ChangeNotStarted", "ChangeResult", "ChangeStep", "build_lease_intent", "run_change"]

#: A step's delta: JSON Patch operations, or a function of the record as the change's lease read it.
Delta = Union[Sequence[Mapping[str, Any]], Callable[[Versioned], Sequence[Mapping[str, Any]]]]


@dataclass(frozen=True)
class ChangeStep:
    """One step: a write to one record, built on that record as the change's lease found it.

    ``name`` is unique within the change and part of the step's intent key (``<change step id>/<name>``): 1 to 64
    characters without ``/``. ``delta`` is the JSON Patch, or a function of the record as it is when the step runs
    (under the lease); a record too large for its owner to send back in a reply cannot be given to a function: that
    step is refused ``state_unavailable``, nothing written, and the change is compensated.
    """

    name: str
    tool: KeyedTool
    entity: EntityRef | Mapping[str, Any]
    params: Mapping[str, Any]
    delta: Delta


@dataclass(frozen=True)
class ChangeInput:
    """A change: its run and step (with the agent, the change's id), its steps, and its clocks in seconds."""

    run_id: str
    step_id: str
    steps: Sequence[ChangeStep]
    #: Lease lifetime from each grant or renewal (renewed past half of it). It must outlast an owner's failover.
    lease_ttl: float = DEFAULT_LEASE_TTL_MS / 1000
    #: How long to wait for a record another change holds before giving up with nothing written.
    wait_for_lease: float = 30.0
    #: Deadline of each submission (default the client's).
    timeout: float | None = None
    #: How long one intent of the change is asked again while its outcome is unknown.
    settle_within: float = 120.0


@dataclass(frozen=True)
class ChangeApplied:
    """Every step applied; ``steps`` holds their replies in step order.

    A change this client saw applied, called again when a lease cannot be taken, is answered from its memory: its
    steps' replies as repeats (``duplicate``, no state), as they are answered when the leases are taken again. The
    memory does not see a step undone since (``writ undo``, :meth:`WritClient.undo`): only owners do, when the leases
    are taken again (the change then ends compensated).
    """

    change: str
    steps: list[AppliedReply]
    status: Literal["applied"] = "applied"


@dataclass(frozen=True)
class ChangeCompensated:
    """A step was not applied (``failed_step``, its ``result``), or was answered as undone since (``undone_by``: the
    change was compensated before, by a run this client does not remember); every step this run applied before it was
    undone. Nothing of the change remains."""

    change: str
    failed_step: str
    result: SubmitResult
    undone: list[AppliedReply]
    status: Literal["compensated"] = "compensated"


@dataclass(frozen=True)
class ChangeNotStarted:
    """A record stayed leased to another change (or kept from this agent, ``lease_cooldown``) for ``wait_for_lease``,
    or could not be leased (``lease_limit``); nothing was written.

    Never the answer to a change known to have run: one whose lease is refused ``lease_hold_exceeded`` (it holds it),
    or ``lease_cooldown`` after its own hold, or after ``heldBefore`` on an answer to its acquires (owners say it held
    a record before: an earlier run, whose lease was released or lapsed), or that this client left incomplete before (or whose run raised
    after a step was built to be sent), ends :class:`ChangeIncomplete`; one it saw applied is answered
    :class:`ChangeApplied`. One it saw compensated has nothing standing: ``not_started`` is true of it; one it saw not
    started (or whose run raised before any step was built, no answer saying it ran before) too, unless ``heldBefore``
    (any value but absent, None or False) is said of a record none of those runs took (then an earlier run's mark:
    :class:`ChangeIncomplete`), or an acquire is refused ``lease_hold_exceeded`` or ``lease_cooldown`` naming it.
    Owners keep what says a change held a record for 15 minutes from its lease's end (its release, or its latest
    acquire when it lapsed, by the agent's clock), the latest 64 such marks per record; an owner of an earlier writ
    version says nothing: a client started anew that resumes a change later than that, whose lease another change
    took meanwhile, ends ``not_started`` for this call, and the earlier run's steps may stand.
    """

    change: str
    entity: EntityRef
    result: SubmitResult
    status: Literal["not_started"] = "not_started"


@dataclass(frozen=True)
class ChangeIncomplete:
    """Not settled: an intent's outcome stayed unknown, a step was escalated, an undo was not applied, or a resumed
    change could not take its leases again, or lost one (or its read of a record) before a step was sent (compensating
    would undo only this run's steps while the earlier run's from that step on may stand). The steps in ``applied`` may stand (all of them when a resume finds the
    change ran but not which). Calling :meth:`WritClient.change` again with the same input resumes it."""

    change: str
    message: str
    applied: list[str]
    result: SubmitResult
    status: Literal["incomplete"] = "incomplete"


ChangeResult = Union[ChangeApplied, ChangeCompensated, ChangeNotStarted, ChangeIncomplete]


def _applied(r: SubmitResult) -> bool:
    return isinstance(r, AppliedReply)


def _unsettled(r: SubmitResult) -> bool:
    return r.status in ("unknown", "blocked")


def _held_off(r: SubmitResult) -> bool:
    """A record another change holds, or owners keep from this agent for a while (``lease_cooldown``): waited out."""
    return isinstance(r, RejectedReply) and r.reason in ("leased", "lease_cooldown")


def _says_held_before(r: SubmitResult) -> bool:
    """Owners say the change held the record before: a refused acquire's ``details.heldBefore``, a granted one's
    ``lease.heldBefore``. Any value but absent, null (None) or false counts (bytes from Kafka are hostile; reading one
    as absent would be the unsafe answer, not_started)."""
    d = r.details if isinstance(r, RejectedReply) else r.lease if isinstance(r, AppliedReply) else None
    if not isinstance(d, dict):
        return False
    held = d.get("heldBefore")
    return held is not None and held is not False


def _detail(r: SubmitResult, field: str) -> str | None:
    """A field of a refusal's ``details``, when it is a string."""
    d = r.details if isinstance(r, RejectedReply) else None
    v = d.get(field) if isinstance(d, dict) else None
    return v if isinstance(v, str) else None


#: Most changes one client remembers having run (the latest).
_MAX_REMEMBERED = 10_000
#: Most steps over those changes (a 50-step change kept 10,000 times would hold 500,000 replies).
_MAX_REMEMBERED_STEPS = 100_000


@dataclass(frozen=True)
class _RunBefore:
    """How a change this client ran ended, as far as it knows: ``incomplete`` (also a run that raised after a step was
    built to be sent), with the steps that may stand; ``applied``, with its steps' replies as repeats (``duplicate``,
    no state: what a run that takes its leases again is answered); ``compensated`` or ``not_started``, nothing of it
    standing. A not_started run (also one that raised before any step was built, owners saying nothing of an earlier
    run) keeps the records it took (``taken``, with those of this client's earlier not_started runs of the change):
    its releases, or lapses, leave owners' marks that it held them, which speak of no step. Marks on other records may
    be an earlier run's (a process that crashed), whose steps may stand."""

    ended: Literal["incomplete", "applied", "compensated", "not_started"]
    standing: tuple[str, ...] = ()
    steps: tuple[AppliedReply, ...] = ()
    taken: tuple[str, ...] = ()


#: The changes each client ran: calling change() again runs one again (a resume, or a repeat of a settled one), and an
#: acquire refused then must not be answered not_started ("nothing was written") over steps that stand. In the
#: client's memory only: a client started anew does not know them.
_run_before: weakref.WeakKeyDictionary[Any, dict[str, _RunBefore]] = weakref.WeakKeyDictionary()
#: What each client's remembered changes weigh against _MAX_REMEMBERED_STEPS.
_run_steps: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_run_lock = threading.Lock()


def _as_repeat(r: AppliedReply) -> AppliedReply:
    """An applied reply as a repeat of it is answered: without the record's state (kept in memory, and stale)."""
    return AppliedReply(
        intent_id=r.intent_id, intent_key=r.intent_key, duplicate=True, at=r.at, status="applied", entity=r.entity.model_copy(), state=None, version=r.version, via=r.via, tool=r.tool, undo_of=r.undo_of
    )


def _weight(r: _RunBefore) -> int:
    """What one remembered change weighs against _MAX_REMEMBERED_STEPS: its steps kept, and itself."""
    return 1 + len(r.steps) + len(r.standing) + len(r.taken)


def _remember(client: Any, change: str, what: _RunBefore) -> None:
    with _run_lock:
        _put(client, change, what)


def _known(client: Any, change: str) -> _RunBefore | None:
    """What this client remembers of the change (call with _run_lock held)."""
    return (_run_before.get(client) or {}).get(change)


def _put(client: Any, change: str, what: _RunBefore) -> None:
    """Remembers ``what`` of the change, the latest (call with _run_lock held)."""
    known = _run_before.get(client)
    if known is None:
        known = _run_before.setdefault(client, {})
    steps = _run_steps.get(client, 0)
    earlier = known.pop(change, None)
    if earlier is not None:
        steps -= _weight(earlier)
    known[change] = what
    steps += _weight(what)
    # The oldest go first; the latest is kept whatever it weighs.
    while len(known) > 1 and (len(known) > _MAX_REMEMBERED or steps > _MAX_REMEMBERED_STEPS):
        steps -= _weight(known.pop(next(iter(known))))
    _run_steps[client] = steps


@dataclass
class _Progress:
    """What a run got to, kept as it goes: when it raises, what it leaves is remembered from it, its leases released."""

    change: str | None = None
    #: A step or undo was built to be sent: from then on the change may have written.
    step_sent: bool = False
    #: Steps built to be sent and not known to be unwritten (refused, or undone since).
    standing: set[str] = dataclasses.field(default_factory=set)
    #: Steps undone by an applied undo.
    undone: set[str] = dataclasses.field(default_factory=set)
    #: Releases the leases the run took.
    release_all: Callable[[], None] | None = None
    #: Records (entity keys) whose lease this run was granted, or may have been (an acquire's outcome unknown).
    taken: set[str] = dataclasses.field(default_factory=set)
    #: Records whose answer to one of this run's acquires said ``heldBefore`` (owners: the change held it before).
    #: Counted also after one of this run's acquires of the record came back unknown or blocked (its own lease may then
    #: have been granted and lapsed, the mark its own: unsure, so incomplete).
    held_before: set[str] = dataclasses.field(default_factory=set)
    #: An acquire was refused lease_hold_exceeded, or lease_cooldown naming this change: the change ran before.
    ran_before: bool = False


def _clean_taken(r: _RunBefore | None) -> set[str] | None:
    """The records a remembered run of the change says it took, whose owners' marks then speak of no step."""
    return set(r.taken) if r is not None and r.ended == "not_started" else None


def _held_before_elsewhere(progress: _Progress, known: _RunBefore | None) -> bool:
    """``heldBefore`` was said of a record none of the remembered not_started runs took: an earlier run's mark."""
    return not progress.held_before <= (_clean_taken(known) or set())


def _put_not_started(client: Any, change: str, taken: set[str]) -> None:
    """What a not_started run leaves in memory (call with _run_lock held: read, merged and written at once, so a run
    of the change on this client that ended meanwhile is not overwritten): the records it took, with those of the
    change's remembered not_started runs (their marks are this client's too). One remembered compensated stays so
    (nothing stands, whatever it took); one remembered incomplete or applied too (its steps stand, and a not_started
    over it would let a later refusal answer not_started)."""
    earlier = _known(client, change)
    if earlier is not None and earlier.ended != "not_started":
        _put(client, change, earlier)
        return
    _put(client, change, _RunBefore("not_started", taken=tuple(sorted((_clean_taken(earlier) or set()) | taken))))


def _remember_not_started(client: Any, change: str, taken: set[str]) -> None:
    with _run_lock:
        _put_not_started(client, change, taken)


def _remember_clean(client: Any, change: str, progress: _Progress) -> None:
    """A run that raised before any step was built wrote nothing: remembered as not_started, with the records it took,
    when this client remembers nothing else of the change (or only not_started runs) and no owner said it ran before:
    not when an acquire was refused lease_hold_exceeded (or lease_cooldown naming it), nor when ``heldBefore`` was said
    of a record no remembered run of this client took (an earlier run's mark: its steps may stand)."""
    with _run_lock:
        earlier = _known(client, change)
        if (earlier is not None and earlier.ended != "not_started") or not progress.taken or progress.ran_before:
            return
        if _held_before_elsewhere(progress, earlier):
            return
        _put_not_started(client, change, progress.taken)


def _hold_exceeded(r: SubmitResult) -> bool:
    """A renewal past the longest hold owners allow (WRIT_LEASE_MAX_HOLD_MS): the lease stays the change's until it lapses."""
    return isinstance(r, RejectedReply) and r.reason == "lease_hold_exceeded"


def build_lease_intent(
    *,
    change: str,
    op: Literal["acquire", "release"],
    entity: EntityRef,
    tool: str,
    agent_id: str,
    run_id: str,
    step_id: str,
    reply_to: str,
    ttl_ms: int | None = None,
) -> WriteIntent:
    """The WriteIntent that takes (``acquire``) or gives back (``release``) a record's lease for a change."""
    return WriteIntent(
        intent_id=str(uuid.uuid4()),
        intent_key=lease_intent_key(change, op, entity),
        entity=entity,
        tool=tool,
        agent=AgentRef(id=agent_id, run_id=run_id, step_id=step_id),
        base_version=LEASE_VERSION,
        delta=[],
        params={},
        reply_to=reply_to,
        created_at=iso_now(),
        lease=IntentLease(change=change, op=op, ttl_ms=ttl_ms if op == "acquire" else None),
    )


@dataclass
class _Record:
    entity: EntityRef
    tool: str
    #: The record as the change last read or wrote it (None after a repeat, or a reply too large for the broker).
    current: Versioned | None = None
    granted_at: float | None = None
    last_version: str | None = None
    #: A renewal was refused ``lease_hold_exceeded``: never renewed again.
    hold_ended: bool = False


def _rejected(like: SubmitResult, reason: str, message: str) -> RejectedReply:
    return RejectedReply(intent_id=like.intent_id, intent_key=like.intent_key, duplicate=False, at=iso_now(), status="rejected", reason=reason, message=message)


def run_change(client: WritClient, change_input: ChangeInput | Mapping[str, Any]) -> ChangeResult:
    """Runs a change for ``client`` (see :meth:`WritClient.change`)."""
    progress = _Progress()
    try:
        result = _run_change_once(client, change_input, progress)
    except BaseException:
        # Raised (a delta function; a submit too large, or of a closed client; a KeyboardInterrupt): before any step, nothing of this run
        # was written, and its leases are released as a change not started releases them; remembered as a not_started
        # run with the records it took (their marks are its own) when nothing says the change ran before. After, steps
        # may stand: the change is remembered as left incomplete, its leases left to expire as an incomplete change's
        # are (a resume takes them again), so calling change() again never answers not_started over them.
        if not progress.step_sent:
            if progress.release_all is not None:
                progress.release_all()
            if progress.change is not None:
                _remember_clean(client, progress.change, progress)
        elif progress.change is not None:
            _remember_raised(client, progress.change, change_input, progress)
        raise
    if isinstance(result, ChangeIncomplete):
        _remember(client, result.change, _RunBefore("incomplete", standing=tuple(result.applied)))
    elif isinstance(result, ChangeApplied):
        _remember(client, result.change, _RunBefore("applied", steps=tuple(_as_repeat(r) for r in result.steps)))
    elif isinstance(result, ChangeCompensated):
        _remember(client, result.change, _RunBefore("compensated"))
    else:
        # not_started: true of the change (nothing known of it, or compensated): nothing stands; the marks its leases left are its own.
        _remember_not_started(client, result.change, progress.taken)
    return result


def _remember_raised(client: Any, change: str, change_input: ChangeInput | Mapping[str, Any], progress: _Progress) -> None:
    """What a run that raised after a step was built leaves: the steps that may stand, with those an earlier run left
    (read and written in one critical section)."""
    undone = progress.undone
    steps = change_input.steps if isinstance(change_input, ChangeInput) else change_input["steps"]
    names = [s.name if isinstance(s, ChangeStep) else s["name"] for s in steps]
    with _run_lock:
        earlier = _known(client, change)
        # An applied change run again is answered from the ledger: it stays applied unless this run undid a step.
        if earlier is not None and earlier.ended == "applied" and not undone:
            return
        before = set(earlier.standing) if earlier is not None and earlier.ended == "incomplete" else set(names) if earlier is not None and earlier.ended == "applied" else set()
        standing = [n for n in names if (n in before or n in progress.standing) and n not in undone]
        _put(client, change, _RunBefore("incomplete", standing=tuple(standing)))


def _run_change_once(client: WritClient, change_input: ChangeInput | Mapping[str, Any], progress: _Progress) -> ChangeResult:
    from .client import backoff_until

    c = change_input if isinstance(change_input, ChangeInput) else ChangeInput(**dict(change_input))
    steps = [s if isinstance(s, ChangeStep) else ChangeStep(**dict(s)) for s in c.steps]
    names: set[str] = set()
    for s in steps:
        if not isinstance(s.name, str) or not 1 <= len(s.name) <= 64 or "/" in s.name:
            raise ValueError(f"change: step name {str(s.name)[:80]!r} must be 1 to 64 characters without '/'")
        if s.name in names:
            raise ValueError(f"change: step name {s.name} is used twice")
        names.add(s.name)
    # A NaN wait never runs out (asked again without end): refused before anything is sent, as a bad time to live is.
    for field, wait in (("wait_for_lease", c.wait_for_lease), ("settle_within", c.settle_within)):
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not math.isfinite(wait) or not 0 <= wait <= threading.TIMEOUT_MAX:
            raise ValueError(f"change: {field} must be a finite number of seconds >= 0, got {wait!r}")
    ttl_ms = round(c.lease_ttl * 1000)
    if not 1000 <= ttl_ms <= MAX_LEASE_TTL_MS:
        raise ValueError(f"change: lease_ttl must be 1 to {MAX_LEASE_TTL_MS // 1000} seconds, got {c.lease_ttl!r}")
    change = change_id(agent_id=client.agent_id, run_id=c.run_id, step_id=c.step_id)
    progress.change = change
    # One lease per record, taken in entity-key order, named by the first step's tool on that record.
    records: dict[str, _Record] = {}
    for s in steps:
        key = entity_key(s.entity)
        if key not in records:
            records[key] = _Record(entity=EntityRef.model_validate(s.entity), tool=s.tool.name)
    # As the TypeScript client sorts them (UTF-16 code units, not code points): both take shared records' leases in one order.
    order = sorted(records, key=utf16_sort_key)

    def lease(key: str, op: Literal["acquire", "release"]) -> WriteIntent:
        r = records[key]
        return build_lease_intent(
            change=change, op=op, entity=r.entity, tool=r.tool, agent_id=client.agent_id, run_id=c.run_id, step_id=f"{c.step_id}/{op}", reply_to=client.reply_topic, ttl_ms=ttl_ms
        )

    def settle(build: Callable[[], WriteIntent], within: float, again: Callable[[SubmitResult], bool] = _unsettled) -> SubmitResult:
        """Submits (a fresh id each time) until the result is settled or ``within`` seconds passed."""
        deadline = time.monotonic() + within
        round_ = 0
        while True:
            result = client.submit(build(), timeout=c.timeout, on_leased="answer")
            if not again(result) or time.monotonic() >= deadline:
                return result
            time.sleep(backoff_until(round_, deadline))
            round_ += 1

    def acquire(key: str, within: float) -> SubmitResult:
        def ask_again(r: SubmitResult) -> bool:
            # Owners said, answering one of this run's acquires (granted or refused), that the change held that record
            # before (an earlier run): kept per record in ``progress.held_before``. A grant says it too: the refused
            # record's mark may be gone (a record keeps its latest marks only) while the granted one's lives. Also
            # after an acquire of the record came back unknown or blocked (this run's own lease may have been granted
            # then and lapsed, leaving the mark; an earlier run's may live too: unsure, so counted).
            if _unsettled(r):
                progress.taken.add(key)
            elif _says_held_before(r):
                progress.held_before.add(key)
            if _hold_exceeded(r) or (isinstance(r, RejectedReply) and r.reason == "lease_cooldown" and _detail(r, "change") == change):
                progress.ran_before = True
            return _unsettled(r) or _held_off(r)

        result = settle(lambda: lease(key, "acquire"), within, ask_again)
        if isinstance(result, AppliedReply):
            progress.taken.add(key)
            r = records[key]
            # A reply too large for the broker carries the version without the record (`truncated`): taken as the
            # record, its None would be what a step's delta function builds on, and the step would drop the rest.
            r.current = None if result.truncated else Versioned(state=result.state, version=result.version)
            r.granted_at = time.monotonic()
            if r.last_version is None:
                r.last_version = result.version
        if _hold_exceeded(result):
            records[key].hold_ended = True
        return result

    def renew() -> SubmitResult | None:
        """Renews every lease past half its life (its acquire again, which also reads the record). A record whose
        version moved past the last one the change saw there was written while the lease had lapsed: stop. A lease
        held as long as owners allow is not renewed (``lease_hold_exceeded``, returned once the others are renewed):
        it stays the change's until it lapses; the change stops going forward, its undos may still run under it."""
        hold_ended: SubmitResult | None = None
        for key in order:
            r = records[key]
            if r.granted_at is None or r.hold_ended or time.monotonic() - r.granted_at <= c.lease_ttl / 2:
                continue
            seen = r.last_version
            renewed = acquire(key, c.settle_within)
            if _hold_exceeded(renewed):
                hold_ended = hold_ended or renewed
                continue
            if not isinstance(renewed, AppliedReply):
                return renewed
            if seen is not None and renewed.version != seen:
                return _rejected(renewed, "lease_not_held", f"the lease of {key} lapsed and the record was written meanwhile ({seen} → {renewed.version}); the change no longer holds it as it left it")
        return hold_ended

    def release_all() -> None:
        # Each asked again while its outcome is unknown: a lease left behind expires, and reads as a stalled agent.
        for key in order:
            if records[key].granted_at is not None:
                try:
                    settle(lambda key=key: lease(key, "release"), 30.0)
                except Exception:  # noqa: BLE001 - a lease not released expires; the change's outcome stands
                    pass

    progress.release_all = release_all

    def not_taken(key: str, got: SubmitResult) -> ChangeResult:
        """How the change ends when a record's lease is not taken before its first step. ``not_started`` says nothing
        of the change was written: not when it is known to have run. A refusal ``lease_hold_exceeded`` says the change
        holds the lease (a resume: its earlier run took it, and its steps may stand); ``lease_cooldown`` naming this
        change, that it held the record lately; ``heldBefore`` on any answer to this run's acquires (a refusal's
        ``details``, a grant's ``lease``), that it held that record before (its leases are all taken before its first
        step, so an earlier run may have written); this client's memory, that it left the change incomplete (or raised
        in it). Each ends it incomplete. A change this client saw applied is answered so again, as taking its leases
        again would answer it (its steps repeats); one it saw compensated has nothing standing, so not_started is true
        of it; one it saw not started too, unless ``heldBefore`` was said of a record none of its remembered not_started
        runs took (that mark is not theirs: an earlier run's, whose steps may stand), or an acquire was refused
        ``lease_hold_exceeded`` or ``lease_cooldown`` naming the change (in this round or an earlier one)."""
        with _run_lock:
            known = _known(client, change)
        if known is not None and known.ended == "applied":
            return ChangeApplied(change=change, steps=[_as_repeat(r) for r in known.steps])
        earlier = list(known.standing) if known is not None and known.ended == "incomplete" else None
        cooled_own = isinstance(got, RejectedReply) and got.reason == "lease_cooldown" and _detail(got, "change") == change
        compensated_before = known is not None and known.ended == "compensated"
        ran_before = not compensated_before and (_hold_exceeded(got) or cooled_own or progress.ran_before or _held_before_elsewhere(progress, known))
        if not _unsettled(got) and not ran_before and earlier is None:
            return ChangeNotStarted(change=change, entity=records[key].entity, result=got)
        # Which steps may stand: those this client knows of, else (it ran, nobody here knows how far) every one.
        applied_names = list(earlier) if earlier is not None else [s.name for s in steps] if ran_before else []
        standing = f"steps {', '.join(applied_names)} may stand" if applied_names else "no step is known to stand"
        if _unsettled(got):
            message = f"no answer to the lease acquire of {key}" + ("" if earlier is None else f" (a change left incomplete before: {standing})")
        elif _hold_exceeded(got):
            message = (
                f"this change has held the lease of {key} as long as owners allow (WRIT_LEASE_MAX_HOLD_MS), so it ran before and {standing}; "
                f"the lease is not renewed and lapses at {_detail(got, 'expiresAt') or 'its expiry'}: call change() again after then to resume"
            )
        elif cooled_own:
            message = (
                f"this change held {key} as long as owners allow, so it ran before and {standing}; "
                f"the record is kept from this agent until {_detail(got, 'until') or 'the cool-down ends'}: call change() again after then to resume"
            )
        elif ran_before and earlier is None:
            why = got.reason if isinstance(got, RejectedReply) else got.status
            message = (
                f"owners say this change held its records before (an earlier run, whose lease ended{', or that it held a lease as long as they allow' if progress.ran_before else ''}), "
                f"so it may have written and {standing}; "
                f"the lease of {key} was not taken now ({why}): call change() again to resume"
            )
        else:
            why = got.reason if isinstance(got, RejectedReply) else got.status
            message = f"this change was left incomplete before ({standing}), and the lease of {key} was not taken now ({why}): call change() again to resume"
        return ChangeIncomplete(change=change, message=message, applied=applied_names, result=got)

    for key in order:
        got = acquire(key, c.wait_for_lease)
        if not _applied(got):
            release_all()
            return not_taken(key, got)

    applied: list[tuple[ChangeStep, AppliedReply]] = []

    # Known, with every lease taken, to be a resume: an earlier run may have written steps this one has not sent yet.
    with _run_lock:
        known = _known(client, change)
    if known is not None and known.ended in ("incomplete", "applied"):
        resumed_from: str | None = f"this client left it {known.ended}"
    elif known is not None and known.ended == "compensated":
        resumed_from = None
    elif progress.ran_before:
        resumed_from = "owners refused a lease as this change's own (lease_cooldown naming it)"
    elif _held_before_elsewhere(progress, known):
        resumed_from = "owners say it held its records before"
    else:
        resumed_from = None

    def stop_resumed(name: str, result: SubmitResult) -> ChangeResult | None:
        """A resume whose lease is lost (or whose read of a record is not answered applied) before step ``name`` is
        sent: an earlier run's steps from this one on may stand, so compensating (undoing this run's steps only) would
        answer compensated over them. Ends incomplete, every step possibly standing. Its leases are released: nothing
        of this run is in flight, and a resume finds the marks they leave for the 15 minutes they live. Known to be a resume when the leases were
        taken, or by this client's memory now (another run of the change on this client may have ended since, applied
        or incomplete). None when the run is not known to be a resume."""
        came_from = resumed_from
        if came_from is None:
            with _run_lock:
                now = _known(client, change)
            if now is not None and now.ended in ("incomplete", "applied"):
                came_from = f"another run of it on this client ended {now.ended} meanwhile"
        if came_from is None:
            return None
        release_all()
        why = f"{result.reason}: {result.message}" if isinstance(result, RejectedReply) else result.status
        every = [s.name for s in steps]
        message = (
            f"this change ran before ({came_from}), and before step {name} was sent the run lost its lease or its read of the record ({why}); "
            f"undoing only this run's steps would leave an earlier run's from {name} on, so nothing is undone: steps {', '.join(every)} may stand; call change() again to resume"
        )
        return ChangeIncomplete(change=change, message=message, applied=every, result=result)

    def step_intent(s: ChangeStep, current: Versioned) -> WriteIntent:
        delta = s.delta(current) if callable(s.delta) else s.delta
        intent = client.build_intent(
            {"tool": s.tool, "entity": s.entity, "run_id": c.run_id, "step_id": f"{c.step_id}/{s.name}", "base_version": current.version, "delta": list(delta), "params": dict(s.params)}
        )
        progress.step_sent = True
        progress.standing.add(s.name)
        return intent.model_copy(update={"lease": IntentLease(change=change, op="step")})

    def standing(undone: list[AppliedReply]) -> list[str]:
        gone = {u.undo_of for u in undone}
        return [s.name for s, reply in applied if reply.intent_key not in gone]

    def compensate(failed_step: str, result: SubmitResult) -> ChangeResult:
        if _unsettled(result) or result.status == "escalated":
            # The step may have been applied (an unknown outcome; an escalation a person may still apply): undoing
            # around it would guess. Resuming the change asks again; an escalation is settled on writ.human first.
            why = f"was escalated ({result.reason}): a person settles it on writ.human" if result.status == "escalated" else "has no known outcome"
            return ChangeIncomplete(change=change, message=f"step {failed_step} {why}; call change() again to resume", applied=[s.name for s, _ in applied], result=result)
        undone: list[AppliedReply] = []
        for s, reply in reversed(applied):
            # A lease past its longest hold is still the change's until it lapses: its undo runs under it (refused
            # lease_not_held, nothing written, once it has lapsed).
            lapsed = renew()
            if lapsed is not None and not _hold_exceeded(lapsed):
                why = lapsed.message if isinstance(lapsed, RejectedReply) else f"a lease could not be renewed ({lapsed.status})"
                left = standing(undone)
                return ChangeIncomplete(change=change, message=f"compensating: {why}; steps {', '.join(left)} stand", applied=left, result=lapsed)

            def undo(s: ChangeStep = s, reply: AppliedReply = reply) -> WriteIntent:
                intent = client.build_undo(
                    {"intentKey": reply.intent_key, "entity": records[entity_key(s.entity)].entity, "tool": s.tool.name}, run_id=c.run_id, step_id=f"{c.step_id}/{s.name}/undo"
                )
                return intent.model_copy(update={"lease": IntentLease(change=change, op="step")})

            got = settle(undo, c.settle_within)
            if isinstance(got, AppliedReply):
                progress.undone.add(s.name)
                progress.standing.discard(s.name)
            if not isinstance(got, AppliedReply):
                left = standing(undone)
                return ChangeIncomplete(change=change, message=f"the undo of step {s.name} was not applied ({got.status}); steps {', '.join(left)} stand", applied=left, result=got)
            undone.append(got)
        release_all()
        return ChangeCompensated(change=change, failed_step=failed_step, result=result, undone=undone)

    for s in steps:
        key = entity_key(s.entity)
        r = records[key]
        lapsed = renew()
        if lapsed is not None:
            return stop_resumed(s.name, lapsed) or compensate(s.name, lapsed)
        # After a repeat (a resumed change), or a reply too large for the broker, the record's state is not known:
        # its acquire again reads it.
        base = r.current
        if base is None:
            read = acquire(key, c.settle_within)
            if not isinstance(read, AppliedReply):
                return stop_resumed(s.name, read) or compensate(s.name, read)
            if read.truncated and callable(s.delta):
                # Still too large to come back: a delta function built on nothing would drop what the record holds.
                message = f"the state of {key} is too large to come back in a reply (truncated), so step {s.name}'s delta function has no record to be built on; nothing was written"
                unavailable = _rejected(read, "state_unavailable", message)
                return stop_resumed(s.name, unavailable) or compensate(s.name, unavailable)
            # A fixed delta needs only the version the lease read.
            base = r.current or Versioned(state=None, version=read.version)
        result = settle(lambda s=s, base=base: step_intent(s, base), c.settle_within)
        # Refused or in conflict: not written (an unknown or escalated one may be).
        if result.status in ("rejected", "conflict"):
            progress.standing.discard(s.name)
        if not isinstance(result, AppliedReply):
            return compensate(s.name, result)
        if result.undone_by is not None:
            # A repeat of a step an applied undo compensated: this change was compensated before (by a run this client
            # does not remember). Going on would write the later steps without this one; nothing of it stands instead.
            progress.standing.discard(s.name)
            return compensate(s.name, result)
        applied.append((s, result))
        r.last_version = result.version
        r.current = None if result.state is None or result.duplicate else Versioned(state=result.state, version=result.version)
    release_all()
    return ChangeApplied(change=change, steps=[reply for _, reply in applied])
