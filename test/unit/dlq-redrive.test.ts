// `writ dlq redrive`'s choices (RedriveRun), with stand-ins for the producer and the reads: which dead letters go,
// in what order, and which one of a record dead-lettered more than once.
import { describe, expect, it } from "vitest";
import { sha256Hex } from "../../src/canonical-json.ts";
import { RedriveRun, type RedriveIo } from "../../src/cli/dlq.ts";
import type { DeadLetterRef } from "../../src/dlq-redrive.ts";
import type { DeadLetter } from "../../src/schemas/dead-letter.ts";
import { acquire, INTENTS, letterOf, naming, other, step, type Original } from "./dlq-letters.ts";

/**
 * A run over `topic` (the intents topic's records) and the dead letters given, in that order at writ.dlq[0]@0…:
 * the values it sent, in order, and the outcome of each dead letter.
 */
async function runOver(topic: Original[], letters: DeadLetter[], options: { max?: number; gone?: number[] } = {}) {
  const dlq = letters.map((_, i): DeadLetterRef => ({ topic: "writ.dlq", partition: 0, offset: String(i) }));
  const sent: string[] = [];
  /** How many held dead letters each read back asked for. */
  const rereads: number[] = [];
  const io: RedriveIo = {
    send: async (m) => void sent.push(m.value.toString()),
    // as originalsOf: the record at the source, when its key and sha256 are the dead letter's
    originals: async (ls) =>
      ls.map((l) => {
        const r = topic.find((o) => o.partition === l.source.partition && o.offset === l.source.offset);
        if (r === undefined) return { outcome: "source_gone" as const, detail: "gone" };
        if (r.key !== l.key || sha256Hex(r.value) !== l.sha256) return { outcome: "source_changed" as const, detail: "another record" };
        return { value: r.value, headers: {} };
      }),
    reread: async (refs) => (rereads.push(refs.length), refs).map((r) => (options.gone?.includes(Number(r.offset)) ? null : { letter: letters[Number(r.offset)]! })),
  };
  const run = new RedriveRun({ intentsTopic: INTENTS, max: options.max ?? 10_000, dryRun: false, io });
  for (const [i, l] of letters.entries()) await run.take(dlq[i]!, l);
  await run.finish();
  return { sent, outcomes: run.selected.map((s) => s.outcome), count: run.sent, rereads };
}

/** What a run's checks compare: all but its read backs. */
const seen = ({ rereads: _rereads, ...rest }: Awaited<ReturnType<typeof runOver>>) => rest;

describe("writ dlq redrive's choices", () => {
  it("a forged truncated dead letter ahead of the real whole one (its key, sha256 and reason, another record's source) is refused source_changed; the real one is sent", async () => {
    const forged = letterOf(step, true, naming(other));
    const got = seen(await runOver([other, step], [forged, letterOf(step, false)]));
    expect(got).toEqual({ sent: [step.value.toString()], outcomes: ["source_changed", "sent"], count: 1 });
  });

  it("so with the real one truncated too: it is sent from its source", async () => {
    const forged = letterOf(acquire, true, naming(other));
    const got = seen(await runOver([other, acquire], [forged, letterOf(acquire, true)]));
    expect(got).toEqual({ sent: [acquire.value.toString()], outcomes: ["source_changed", "sent"], count: 1 });
  });

  it("a record's truncated dead letters (sent back too early, dead-lettered again) are one record once read: the first is sent, the next same_record", async () => {
    const again = { ...acquire, offset: "9" };
    const got = seen(await runOver([acquire, again], [letterOf(acquire, true), letterOf(again, true)]));
    expect(got).toEqual({ sent: [acquire.value.toString()], outcomes: ["sent", "same_record"], count: 1 });
  });

  it("a record's whole dead letter after its truncated one goes after it (an acquire before its lease's step); other records' as they are read", async () => {
    const got = seen(await runOver([acquire, step, other], [letterOf(acquire, true), letterOf(step, false), letterOf(other, false)]));
    expect(got).toEqual({ sent: [other.value.toString(), acquire.value.toString(), step.value.toString()], outcomes: ["sent", "sent", "sent"], count: 3 });
  });

  it("one held behind a truncated one and gone from writ.dlq when read back is not sent (dead_letter_gone), nor counted", async () => {
    const got = seen(await runOver([acquire, step], [letterOf(acquire, true), letterOf(step, false)], { gone: [1] }));
    expect(got).toEqual({ sent: [acquire.value.toString()], outcomes: ["sent", "dead_letter_gone"], count: 1 });
  });

  it("--max counts the held ones in the order read", async () => {
    const got = seen(await runOver([acquire, step, other], [letterOf(acquire, true), letterOf(step, false), letterOf(other, false)], { max: 2 }));
    expect(got).toEqual({ sent: [acquire.value.toString(), step.value.toString()], outcomes: ["sent", "sent", "over_max"], count: 2 });
  });

  it("a copy of a held record takes no --max place while its first may be sent: --max 2 over a truncated record, its copy and another sends both records", async () => {
    const again = { ...acquire, offset: "9" };
    const got = seen(await runOver([acquire, again, other], [letterOf(acquire, true), letterOf(again, true), letterOf(other, false)], { max: 2 }));
    expect(got).toEqual({ sent: [other.value.toString(), acquire.value.toString()], outcomes: ["sent", "same_record", "sent"], count: 2 });
  });

  it("a copy of a held record whose first is refused is sent in its place, within --max", async () => {
    const forged = letterOf(acquire, true, naming(other));
    const got = seen(await runOver([other, acquire], [forged, letterOf(acquire, true)], { max: 1 }));
    expect(got).toEqual({ sent: [acquire.value.toString()], outcomes: ["source_changed", "sent"], count: 1 });
  });

  it("held dead letters are read back 500 at a time, in the order read: no more values held at once", async () => {
    const steps = Array.from({ length: 1_100 }, (_, i): Original => ({ key: acquire.key, value: Buffer.from(`{"step":${i}}`), partition: 1, offset: String(100 + i) }));
    const got = await runOver([acquire, ...steps], [letterOf(acquire, true), ...steps.map((o) => letterOf(o, false))]);
    expect(got.rereads).toEqual([499, 500, 101]);
    expect(got.sent).toEqual([acquire, ...steps].map((o) => o.value.toString()));
    expect(got.count).toBe(1_101);
  });
});
