// A valid WriteIntent for the codec's tests: what it frames does not matter to them, only that zod accepts it.
import { randomUUID } from "node:crypto";
import type { WriteIntent } from "../../src/schemas/write-intent.ts";

/** A fresh intent (its own intentId), valid for the WriteIntent schema. */
export const sampleIntent = (): WriteIntent => ({
  intentId: randomUUID(),
  intentKey: "a".repeat(64),
  entity: { type: "ticket", id: "T-1" },
  tool: "tag_ticket",
  agent: { id: "a", runId: "r", stepId: "s" },
  baseVersion: '"v1"',
  delta: [{ op: "add", path: "/tags/-", value: "x" }],
  params: { tag: "x" },
  replyTo: "writ.replies.a",
  createdAt: new Date().toISOString(),
});
