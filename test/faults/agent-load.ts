import type { IntentInput, SubmitResult, WritClient } from "../../producers/writ-client.ts";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { readRecord } from "../../examples/example-stack.ts";
import { noteTicket } from "./fault-tools.ts";
import type { Rng } from "./rng.ts";

/** One business intent of the load, and what became of it. */
export interface PlannedIntent {
  agent: string;
  kind: "refund" | "tag" | "note";
  entity: { type: string; id: string };
  /** What the intent adds: a refund `ref`, a tag or a note `ref`; unique in the run. */
  mark: string;
  intentKey?: string;
  /** Submissions sent (resubmits included). 0: never submitted before the deadline. */
  submissions: number;
  final?: SubmitResult;
  /** The last non-final answer (`unknown`, `blocked`), for the diagnosis. */
  lastStatus?: string;
}

export interface LoadOptions {
  runId: string;
  recordsUrl: string;
  submitTimeoutMs: number;
  /** Share of intents submitted twice at once, and again after their answer. */
  resubmitRate: number;
  deadline: () => number;
  onSettled: () => void;
  /** Awaited before each new intent: the suite holds new load while a fault it has made due has not begun. */
  gate?: () => Promise<void>;
  rng: Rng;
}

function build(p: PlannedIntent, runId: string, base: { state: any; version: string }): IntentInput {
  const common = { entity: p.entity, runId: `${runId}-${p.agent}`, stepId: `step-${p.mark}`, baseVersion: base.version };
  if (p.kind === "refund") {
    const amountCents = 100 + (hash(p.mark) % 5000);
    return {
      ...common,
      tool: refundPayment,
      delta: [{ op: "add", path: "/refunds/-", value: { amountCents, reason: "goodwill", ref: p.mark } }],
      params: { amountCents, reason: "goodwill", ref: p.mark },
    };
  }
  if (p.kind === "note") {
    return {
      ...common,
      tool: noteTicket,
      delta: [{ op: "add", path: "/notes/-", value: { ref: p.mark, text: `note ${p.mark}` } }],
      params: { ref: p.mark, text: `note ${p.mark}` },
    };
  }
  return {
    ...common,
    tool: tagTicket,
    delta: [{ op: "replace", path: "/tags", value: [...(base.state.tags ?? []), p.mark] }],
    params: { tag: p.mark },
  };
}

function hash(s: string): number {
  let h = 0;
  for (const c of s) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return h;
}

/**
 * One agent working through its intents with `concurrency` in flight. It
 * behaves as a careful harness does: an `unknown` or `blocked` answer or a
 * failed send is asked again with the same intent key (always safe); a
 * conflict is decided again from `current`; and some intents are
 * resubmitted on purpose, at once and after their answer, as retries and
 * resumes do.
 */
export async function runAgent(client: WritClient, intents: PlannedIntent[], concurrency: number, opts: LoadOptions): Promise<void> {
  const extra: Promise<unknown>[] = [];
  let next = 0;
  const worker = async () => {
    while (next < intents.length && Date.now() < opts.deadline()) {
      await opts.gate?.();
      if (next >= intents.length || Date.now() >= opts.deadline()) break;
      const p = intents[next++]!;
      let base: { state: any; version: string };
      try {
        base = await readRecord<any>(opts.recordsUrl, p.entity.type, p.entity.id);
      } catch {
        // The records server is in an outage the suite caused: read again shortly.
        next--;
        intents.splice(next, 1);
        intents.push(p);
        await new Promise((r) => setTimeout(r, 500));
        continue;
      }
      let input = build(p, opts.runId, base);
      p.intentKey = client.buildIntent(input).intentKey;
      while (Date.now() < opts.deadline()) {
        p.submissions++;
        if (opts.rng.next() < opts.resubmitRate) {
          p.submissions++;
          extra.push(client.submit(input, { timeoutMs: opts.submitTimeoutMs }).catch(() => undefined));
        }
        let reply: SubmitResult;
        try {
          reply = await client.submit(input, { timeoutMs: opts.submitTimeoutMs });
        } catch {
          await new Promise((r) => setTimeout(r, 500));
          continue;
        }
        if (reply.status === "unknown" || reply.status === "blocked") {
          p.lastStatus = reply.status === "blocked" ? `blocked at ${reply.topic}-${reply.partition}@${reply.offset}` : "unknown";
          continue;
        }
        if (reply.status === "conflict") {
          base = reply.current as typeof base;
          input = build(p, opts.runId, base);
          continue;
        }
        p.final = reply;
        break;
      }
      if (p.final && opts.rng.next() < opts.resubmitRate) {
        p.submissions++;
        extra.push(client.submit(input, { timeoutMs: opts.submitTimeoutMs }).catch(() => undefined));
      }
      opts.onSettled();
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  await Promise.all(extra);
}
