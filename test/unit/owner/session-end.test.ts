// A partition owner's session ending (the partition revoked, router.stop(), reopen() after a hold) while its
// commit loop is at work: nothing of the ended session commits. Its open transaction is aborted, and the offset
// (the ledger's progress entry, the group's) never passes an intent whose result did not commit: the next owner
// resumes there, and each intent is processed and answered.
import { afterEach, describe, expect, it, vi } from "vitest";
import { WireCodec } from "../../../src/codec.ts";
import type { SystemOfRecord } from "../../../src/sor/adapter.ts";
import { admitTools } from "../../../src/tools.ts";
import { FakeSystem } from "./fake-system.ts";
import { addTag } from "./pipeline-fixtures.ts";
import { addTagIntentJson, frozenClock, gate, intentRecord, ownerWith, txns, until } from "./partition-owner-harness.ts";

vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith([]) };
});

afterEach(() => {
  txns.length = 0;
  vi.restoreAllMocks();
});

const T1 = { type: "ticket", id: "T-1" };
const LINGER_MS = 1_000;

/** The offsets committed transactions carried: the ledger's progress entries and the group's offset. */
function committedOffsets(): { progress: string[]; group: string[] } {
  const committed = txns.filter((t) => t.committed);
  const progress = committed.flatMap((t) => t.records).filter((r) => r.key === "__progress__:0").map((r) => (JSON.parse(r.value!.toString("utf8")) as { offset: string }).offset);
  return { progress, group: committed.flatMap((t) => (t.offset === null ? [] : [t.offset])) };
}

/**
 * Offset 0: an intent whose fresh read hangs (at work: the commit loop lingers for it); 1: a record answered at
 * admission (a dead letter, staged); 2: an intent of the same record, waiting behind 0. The loop lingers with the
 * dead letter staged and the first intent's `pending` entry in the open transaction.
 */
async function lingering() {
  const clock = frozenClock();
  const sys = new FakeSystem("helpdesk");
  sys.seed(T1, { tags: [] });
  const read = gate();
  let reading = false;
  const blocking: SystemOfRecord = Object.assign(Object.create(sys), {
    name: "helpdesk",
    capabilities: sys.capabilities,
    read: async (e: never, o: never) => {
      reading = true;
      await read.wait;
      return sys.read(e, o);
    },
  });
  const codec = new WireCodec({});
  const encode = codec.encode.bind(codec);
  let deadLettered = false;
  codec.encode = async (topic, name, value) => {
    const out = await encode(topic, name, value);
    if (name === "DeadLetter") deadLettered = true;
    return out;
  };
  const owner = ownerWith({ codec, tools: admitTools([addTag], [blocking], { sorTimeoutMs: 1_000 }), config: { commitLingerMs: LINGER_MS, sorTimeoutMs: 1_000 } });
  owner.start();
  await until(() => owner.state === "running", () => `owner ${owner.state}`);
  owner.accept([intentRecord(0, addTagIntentJson("a")), intentRecord(1, "not JSON"), intentRecord(2, addTagIntentJson("b"))], "2");
  // The dead letter is staged in the same turn as its encode ends; the intent's `pending` entry is in the open transaction.
  await until(() => reading && deadLettered && txns.some((t) => t.records.length > 0), () => `reading ${reading}, dead-lettered ${deadLettered}`);
  return { owner, clock, read, sys };
}

describe("a session ending while its commit loop lingers (session-end-during-linger)", () => {
  it("control: the linger not run out yet at the end: the open transaction is aborted, nothing committed", async () => {
    const { owner, read } = await lingering();
    const closing = owner.close();
    read.open();
    await closing;
    expect(txns.filter((t) => t.committed)).toEqual([]);
    expect(txns.every((t) => t.aborted)).toBe(true);
  });

  // The event loop a few ms late: the linger's deadline passed before its timer fired, and the session's end
  // wakes the loop first. The loop must not commit then: the owner's intake state is cleared by then, and the
  // offset it would compute is everything fetched (3), past intent 0 (never answered) and intent 2 (never run).
  for (const end of ["close", "reopen"] as const) {
    it(`${end}() after the linger ran out and before its timer fired: nothing committed, the open transaction aborted`, async () => {
      const { owner, clock, read } = await lingering();
      const before = txns.length;
      clock.advance(LINGER_MS + 1);
      if (end === "close") {
        const closing = owner.close();
        read.open();
        await closing;
      } else {
        owner.reopen();
        read.open();
        // The session ended and the partition opened again (a new producer: its transactions come after).
        await until(() => owner.state === "running" && txns.slice(0, before).every((t) => t.aborted || t.committed), () => `owner ${owner.state}`);
        await owner.close();
      }
      expect(committedOffsets()).toEqual({ progress: [], group: [] });
      expect(txns.slice(0, before).map((t) => ({ committed: t.committed, aborted: t.aborted }))).toEqual(txns.slice(0, before).map(() => ({ committed: false, aborted: true })));
    });
  }

  it("a commit whose session ends while it waits for its progress entry is aborted, not committed", async () => {
    const codec = new WireCodec({});
    const encode = codec.encode.bind(codec);
    const progress = gate();
    let progressAsked = false;
    codec.encode = async (topic, name, value) => {
      if (name === "LedgerEntry" && (value as { kind?: string }).kind === "progress") {
        progressAsked = true;
        await progress.wait;
      }
      return encode(topic, name, value);
    };
    const owner = ownerWith({ codec });
    owner.start();
    await until(() => owner.state === "running", () => `owner ${owner.state}`);
    owner.accept([intentRecord(0, "not JSON")], "0");
    await until(() => progressAsked, () => "the commit never asked for its progress entry");
    const closing = owner.close();
    progress.open();
    await closing;
    expect(committedOffsets()).toEqual({ progress: [], group: [] });
    expect(txns.filter((t) => t.committed)).toEqual([]);
  });
});
