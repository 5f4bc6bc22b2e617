// The owner's lease on its group membership: how it knows, before each write
// to a system of record, that no successor can have taken its partitions.
//
// The group coordinator drops a member that sent nothing for
// `sessionTimeoutMs`; only then can another member be assigned its partitions
// and fence its producers. So while less than half the session timeout has
// passed since a heartbeat (or the SyncGroup of a join) that the coordinator
// answered was SENT, the membership stands: the coordinator received it after
// it was sent and counts its timeout from then. Dated from the answer instead,
// the lease would be renewed by an answer read late: a process paused
// (SIGSTOP, a long GC, a VM stall) while a heartbeat was in flight reads its
// answer on waking and believed itself the owner, although the pause outlasted
// the session and a successor had written meanwhile. The fault suite's zombie
// saw exactly that once (2026-12-02, a three-broker run: two PATCHes after the
// resume, both refused by If-Match). kafkajs's network events carry each
// request's send time; its HEARTBEAT and GROUP_JOIN events come after the
// answer, and a failed heartbeat emits none.
import type { Consumer } from "kafkajs";

export interface MemberLease {
  /** Whether the membership certainly still stands now. */
  confirmed(): boolean;
}

/**
 * Follows `consumer`'s Heartbeat and SyncGroup requests: the lease runs for
 * `sessionTimeoutMs / 2` from the send time of the last one the coordinator
 * answered without error. `now` is for tests.
 */
export function memberLease(consumer: Pick<Consumer, "on" | "events">, sessionTimeoutMs: number, now: () => number = Date.now): MemberLease {
  /** Send times of the requests whose answers came in last, by API; a HEARTBEAT or GROUP_JOIN event says the answer was good. */
  const sent = { Heartbeat: 0, SyncGroup: 0 };
  let since = 0;
  consumer.on(consumer.events.REQUEST, (event) => {
    const api = event.payload.apiName;
    if (api === "Heartbeat" || api === "SyncGroup") sent[api] = event.payload.sentAt;
  });
  consumer.on(consumer.events.HEARTBEAT, () => {
    since = Math.max(since, sent.Heartbeat);
  });
  consumer.on(consumer.events.GROUP_JOIN, () => {
    since = Math.max(since, sent.SyncGroup);
  });
  return { confirmed: () => now() - since < sessionTimeoutMs / 2 };
}

/**
 * Runs `act` once `delayMs` have passed and the membership is confirmed, looking again every `delayMs` until
 * then; gives up as soon as `wanted()` is false. For a partition taken up again after its owner was fenced: a
 * member the group has dropped without knowing it yet (its heartbeats unanswered) still lists the partition as
 * its own, and a new owner's InitProducerId would fence the owner the group chose, which would take it up again
 * in turn, back and forth for as long as the member stays cut off.
 */
export function whenConfirmed(lease: MemberLease, delayMs: number, wanted: () => boolean, act: () => void): void {
  const look = () => {
    if (!wanted()) return;
    if (lease.confirmed()) act();
    else setTimeout(look, delayMs).unref();
  };
  setTimeout(look, delayMs).unref();
}
