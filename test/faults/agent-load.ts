import type { SubmitResult, WritClient } from "../../producers/writ-client.ts";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import type { IntentInput } from "../../producers/writ-client.ts";
import { readRecord } from "../../examples/example-stack.ts";

/** One business intent of the load, and what became of it. */
export interface PlannedIntent {
  agent: string;
  kind: "refund" | "tag";
  entity: { type: string; id: string };
  /** What the intent adds: a refund `ref` or a tag; unique in the run. */
  mark: string;
  intentKey?: string;
  submissions: number;
  final?: SubmitResult;
}

export interface LoadOptions {
  runId: string;
  recordsUrl: string;
  submitTimeoutMs: number;
  /** Share of intents submitted twice at once, and again after their answer. */
  resubmitRate: number;
  deadlineMs: number;
  onSettled: () => void;
}

function build(p: PlannedIntent, runId: string, base: { state: any; version: string }): IntentInput {
  const common = { entity: p.entity, runId: `${runId}-${p.agent}`, stepId: `step-${p.mark}`, baseVersion: base.version };
  if (p.kind === "refund") {
    const amountCents = 100 + (hash(p.mark) % 5000);
    return {
      ...common,
      tool: refundPayment,
      delta: [{ op: "add", path: "/refunds/-", value: { amountCents, reason: "goodwill", ref: p.mark } }],
      params: { amountCents, reason: "goodwill" },
    };
  }
  return {
    ...common,
    tool: tagTicket,
    delta: [{ op: "replace", path: "/tags", value: [...base.state.tags, p.mark] }],
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
 * behaves as a careful harness does: an `unknown` or a failed send is asked
 * again with the same intent key (always safe); a conflict is decided again
 * from `current`; and some intents are resubmitted on purpose, at once and
 * after their answer, as retries and resumes do.
 */
export async function runAgent(client: WritClient, intents: PlannedIntent[], concurrency: number, opts: LoadOptions): Promise<void> {
  const deadline = Date.now() + opts.deadlineMs;
  const extra: Promise<unknown>[] = [];
  let next = 0;
  const worker = async () => {
    while (next < intents.length) {
      const p = intents[next++]!;
      let base = await readRecord<any>(opts.recordsUrl, p.entity.type, p.entity.id);
      let input = build(p, opts.runId, base);
      p.intentKey = client.buildIntent(input).intentKey;
      while (Date.now() < deadline) {
        p.submissions++;
        if (Math.random() < opts.resubmitRate) {
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
        if (reply.status === "unknown") continue;
        if (reply.status === "conflict") {
          base = reply.current as typeof base;
          input = build(p, opts.runId, base);
          continue;
        }
        p.final = reply;
        break;
      }
      if (p.final && Math.random() < opts.resubmitRate) {
        p.submissions++;
        extra.push(client.submit(input, { timeoutMs: opts.submitTimeoutMs }).catch(() => undefined));
      }
      opts.onSettled();
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  await Promise.all(extra);
}
