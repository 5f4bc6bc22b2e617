// The hostile-input suite's agents and wire helpers: three agents with Ed25519 keys made at run time,
// valid intents built and signed as writ's client builds them, Confluent framing, and an oracle,
// written here independently of src/ (canonical JSON, intent key, signature check), that says which
// records are genuinely signed intents of a registered agent: only those may ever cause an effect.
import { createHash, generateKeyPairSync, randomUUID, verify, type KeyObject } from "node:crypto";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { intentKey } from "../../src/keys.ts";
import { AgentRegistry } from "../../src/security/agent-registry.ts";
import { SIGNATURE_HEADER, signIntent } from "../../src/security/signing.ts";

export { SIGNATURE_HEADER };

export interface Agent {
  id: string;
  keyId: string;
  privateKey: KeyObject;
  publicKey: KeyObject;
  /** Tool names, or `*`. */
  tools: string[];
  replyTopic: string;
}

/** The tools' key-relevant declarations (data, not code under test). */
export const TOOLS = {
  refund_payment: { decl: refundPayment, recordType: "payment", keyScope: "run" as const, intentFields: ["amountCents", "reason"] },
  tag_ticket: { decl: tagTicket, recordType: "ticket", keyScope: "run" as const, intentFields: ["tag"] },
};
export type ToolName = keyof typeof TOOLS;

export function makeAgents(runId: string): Agent[] {
  const mk = (id: string, tools: string[]): Agent => {
    const pair = generateKeyPairSync("ed25519");
    return { id, keyId: "k1", privateKey: pair.privateKey, publicKey: pair.publicKey, tools, replyTopic: `writ.replies.${id}.${runId}` };
  };
  return [mk("billing-agent", ["refund_payment"]), mk("support-alice", ["tag_ticket"]), mk("ops-bot", ["*"])];
}

export function registryOf(agents: Agent[]): AgentRegistry {
  return AgentRegistry.from({
    agents: Object.fromEntries(
      agents.map((a) => [a.id, { keys: [{ id: a.keyId, publicKey: a.publicKey.export({ type: "spki", format: "pem" }).toString() }], tools: a.tools, replyTopic: a.replyTopic }]),
    ),
  });
}

export const mayCall = (a: Agent, tool: string) => (a.tools.includes("*") ? Object.hasOwn(TOOLS, tool) : a.tools.includes(tool));

export type Json = any;

/** A valid intent as writ's client builds it (src's intentKey, as the client uses). */
export function buildIntent(agent: Agent, o: { tool: ToolName; entityId: string; runId: string; stepId: string; baseVersion: string; delta: Json[]; params: Record<string, unknown> }): Json {
  const t = TOOLS[o.tool];
  const entity = { type: t.recordType, id: o.entityId };
  return {
    intentId: randomUUID(),
    intentKey: intentKey({ tool: { name: o.tool, keyScope: t.keyScope, intentFields: t.intentFields }, agentId: agent.id, runId: o.runId, stepId: o.stepId, entity, params: o.params }),
    entity,
    tool: o.tool,
    agent: { id: agent.id, runId: o.runId, stepId: o.stepId },
    baseVersion: o.baseVersion,
    delta: o.delta,
    params: o.params,
    replyTo: agent.replyTopic,
    createdAt: new Date().toISOString(),
  };
}

/** A refund whose delta is the one its params give (the tool's `delta`); `ref` (kept on the refund) is the step id, cut to 64. */
export const refundOf = (agent: Agent, entityId: string, runId: string, stepId: string, amountCents: number) => {
  const ref = stepId.slice(0, 64) || "ref";
  return buildIntent(agent, { tool: "refund_payment", entityId, runId, stepId, baseVersion: '"v1"', delta: [{ op: "add", path: "/refunds/-", value: { amountCents, reason: "late", ref } }], params: { amountCents, reason: "late", ref } });
};

/** A tag on a fresh ticket (tags []): the delta its params give there. */
export const tagOf = (agent: Agent, entityId: string, runId: string, stepId: string, tag: string) =>
  buildIntent(agent, { tool: "tag_ticket", entityId, runId, stepId, baseVersion: '"v1"', delta: [{ op: "replace", path: "/tags", value: [tag] }], params: { tag } });

/** The `writ-signature` header value, by writ's own signer (as the client signs). */
export const sign = (value: unknown, agent: Agent): string => signIntent(value, { keyId: agent.keyId, privateKey: agent.privateKey });

export function frame(schemaId: number, body: string | Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt8(0, 0);
  head.writeInt32BE(schemaId, 1);
  return Buffer.concat([head, Buffer.isBuffer(body) ? body : Buffer.from(body, "utf8")]);
}

export const sha256 = (b: Buffer) => createHash("sha256").update(b).digest("hex");
export const entityKeyOf = (type: string, id: string) => `${type}:${id}`;

// ---------------------------------------------------------------------------
// The oracle: independent of src/.

/** What an owner parses out of a value: strips a 5-byte frame after a 0 magic byte, then UTF-8 and JSON. */
export function parseLikeOwner(value: Buffer | null): unknown {
  if (value === null || value.length === 0) return undefined;
  let body = value;
  if (value[0] === 0) {
    if (value.length <= 5) return undefined;
    body = value.subarray(5);
  }
  try {
    return JSON.parse(body.toString("utf8"));
  } catch {
    return undefined;
  }
}

function depthOver(v: unknown, limit: number): boolean {
  const stack: [unknown, number][] = [[v, 0]];
  while (stack.length > 0) {
    const [x, d] = stack.pop()!;
    if (x === null || typeof x !== "object") continue;
    if (d + 1 > limit) return true;
    for (const c of Object.values(x)) stack.push([c, d + 1]);
  }
  return false;
}

/**
 * RFC 8785 (JCS), written here from the RFC: members in ascending order of their keys' UTF-16 code
 * units at every depth (`Array.prototype.sort`'s default order; no array-index keys first), strings
 * and numbers as JSON.stringify writes them (ECMAScript's own rules, which JCS adopts). A lone
 * surrogate in a string or key, or a non-finite number (1e400 parses to Infinity), has no canonical
 * form: null, so nothing over such a value verifies.
 */
function canon(v: unknown): string | null {
  try {
    return jcs(v);
  } catch {
    return null;
  }
}

function jcs(v: unknown): string {
  if (typeof v === "string") {
    if (/\p{Cs}/u.test(v)) throw new Error("lone surrogate");
    return JSON.stringify(v);
  }
  if (typeof v === "number" && !Number.isFinite(v)) throw new Error("not a finite number");
  if (Array.isArray(v)) return `[${v.map(jcs).join(",")}]`;
  if (v !== null && typeof v === "object") {
    const keys = Object.keys(v).sort();
    return `{${keys.map((k) => `${jcs(k)}:${jcs((v as Record<string, unknown>)[k])}`).join(",")}}`;
  }
  return JSON.stringify(v);
}

const str = (v: unknown): v is string => typeof v === "string";
const obj = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === "object" && !Array.isArray(v);

/** The intent key as the README's wire contract defines it: sha256 of the canonical JSON of {v, scope, agent, run, step, tool, target, fields}. */
export function independentIntentKey(v: Record<string, unknown>, agentId: string): string | null {
  if (typeof v.tool !== "string" || !Object.hasOwn(TOOLS, v.tool)) return null;
  const tool = TOOLS[v.tool as ToolName];
  const agent = v.agent;
  const entity = v.entity;
  const params = v.params;
  if (!tool || !obj(agent) || !obj(entity) || !obj(params) || !str(agent.runId) || !str(agent.stepId) || !str(entity.type) || !str(entity.id)) return null;
  const fields: Record<string, unknown> = {};
  for (const f of tool.intentFields) {
    if (!Object.hasOwn(params, f)) return null;
    fields[f] = params[f];
  }
  const body = { v: 2, scope: tool.keyScope, agent: agentId, run: agent.runId, step: agent.stepId, tool: v.tool, target: `${entity.type}:${entity.id}`, fields };
  const text = canon(body);
  return text === null ? null : createHash("sha256").update(text, "utf8").digest("hex");
}

export interface OracleView {
  /** The intent id an owner would answer with (first 128 chars of a string), else "". */
  intentId: string;
  /** The agent id the record claims, if any. */
  claimed: string | null;
  /** Genuinely signed by the registered agent it names, for a tool it may call, its registered reply topic, and the intent key of its own fields. */
  valid: boolean;
  intentKey: string | null;
}

/** Classifies one record as an owner would see it. `headerValues`: every value of the `writ-signature` header on the record. */
export function oracle(value: Buffer | null, headerValues: (string | Buffer | null)[], agents: ReadonlyMap<string, Agent>, maxDepth = 32): OracleView {
  const parsed = parseLikeOwner(value);
  const out: OracleView = { intentId: "", claimed: null, valid: false, intentKey: null };
  if (!obj(parsed)) return out;
  if (str(parsed.intentId)) out.intentId = parsed.intentId.slice(0, 128);
  if (obj(parsed.agent) && str(parsed.agent.id)) out.claimed = parsed.agent.id.slice(0, 128);
  if (depthOver(parsed, maxDepth)) return out;
  const agent = out.claimed === null ? undefined : agents.get(out.claimed);
  if (!agent || headerValues.length !== 1 || headerValues[0] === null) return out;
  const header = headerValues[0]!.toString();
  const parts = header.split(" ");
  if (parts.length !== 3 || parts[0] !== "ed25519" || parts[1] !== agent.keyId) return out;
  const sig = Buffer.from(parts[2]!, "base64");
  if (sig.length !== 64) return out;
  const signed = canon(parsed);
  if (signed === null || !verify(null, Buffer.from(signed, "utf8"), agent.publicKey, sig)) return out;
  if (!str(parsed.tool) || !mayCall(agent, parsed.tool) || parsed.replyTo !== agent.replyTopic) return out;
  const key = independentIntentKey(parsed, agent.id);
  if (key === null || key !== parsed.intentKey) return out;
  out.valid = true;
  out.intentKey = key;
  return out;
}
