import { readFileSync } from "node:fs";
import type { KeyObject } from "node:crypto";
import { z } from "zod";
import { parseConfig } from "../config.ts";
import { WritError } from "../errors.ts";
import { publicKeyFrom } from "./signing.ts";

const AgentEntry = z.strictObject({
  /** Public keys the agent signs with, by key id; more than one during a rotation. */
  keys: z
    .array(z.strictObject({ id: z.string().regex(/^[A-Za-z0-9._:-]{1,64}$/, "1–64 of A-Z a-z 0-9 . _ : -"), publicKey: z.string().min(1) }))
    .min(1, "at least one key")
    // A rotation's new key under the old one's id would take its place silently, refusing the agents still on it.
    .superRefine((keys, ctx) => {
      const seen = new Set<string>();
      keys.forEach((k, i) => {
        if (seen.has(k.id)) ctx.addIssue({ code: "custom", path: [i, "id"], message: `key id ${k.id} is listed twice: each key needs its own id (a rotation adds the new key under a new id)` });
        seen.add(k.id);
      });
    }),
  /** Write tools the agent may call; `*` for all. */
  tools: z.array(z.string().min(1)).min(1, "at least one tool (or *)"),
  /** The agent's reply topic: every reply to it goes there, and an intent must name it as `replyTo`. */
  replyTopic: z.string().regex(/^[a-zA-Z0-9._-]{1,249}$/, "a Kafka topic name"),
});

/**
 * The agent registry file (`WRIT_AGENT_REGISTRY`): agent id → public keys,
 * allowed tools and reply topic. JSON:
 *
 * ```json
 * { "agents": { "billing-agent": { "keys": [{ "id": "2026-11", "publicKey": "<PEM or base64 raw>" }],
 *                                   "tools": ["refund_payment"], "replyTopic": "writ.replies.billing-agent" } } }
 * ```
 */
export const AgentRegistryFile = z.strictObject({ agents: z.record(z.string().min(1).max(128), AgentEntry) });
export type AgentRegistryFile = z.input<typeof AgentRegistryFile>;

export interface RegisteredAgent {
  id: string;
  keys: ReadonlyMap<string, KeyObject>;
  tools: ReadonlySet<string>;
  replyTopic: string;
  mayCall(tool: string): boolean;
}

/**
 * Who may submit intents to the owners: with a registry, every intent must
 * be signed by a key of the agent it names, may call only that agent's tools,
 * and is answered only on that agent's reply topic.
 */
export class AgentRegistry {
  private readonly agents: ReadonlyMap<string, RegisteredAgent>;
  private readonly replyTopicSet: ReadonlySet<string>;

  private constructor(agents: Map<string, RegisteredAgent>) {
    this.agents = agents;
    this.replyTopicSet = new Set([...agents.values()].map((a) => a.replyTopic));
  }

  /** Whether `topic` is some agent's reply topic. */
  hasReplyTopic(topic: string): boolean {
    return this.replyTopicSet.has(topic);
  }

  static from(input: unknown): AgentRegistry {
    const file = parseConfig(AgentRegistryFile, input, "agent registry");
    const agents = new Map<string, RegisteredAgent>();
    for (const [id, entry] of Object.entries(file.agents)) {
      const keys = new Map<string, KeyObject>();
      entry.keys.forEach((k, i) => {
        try {
          keys.set(k.id, publicKeyFrom(k.publicKey));
        } catch (err) {
          // Names the field, never the key material.
          throw parseConfigError(`agents.${id}.keys.${i}.publicKey`, (err as Error).message);
        }
      });
      const tools = new Set(entry.tools);
      agents.set(id, { id, keys, tools, replyTopic: entry.replyTopic, mayCall: (tool) => tools.has("*") || tools.has(tool) });
    }
    return new AgentRegistry(agents);
  }

  static fromFile(path: string): AgentRegistry {
    let text: string;
    try {
      text = readFileSync(path, "utf8");
    } catch (err) {
      throw parseConfigError("WRIT_AGENT_REGISTRY", `cannot read ${path}: ${(err as Error).message}`);
    }
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch (err) {
      throw parseConfigError("WRIT_AGENT_REGISTRY", `${path} is not JSON: ${(err as Error).message}`);
    }
    return AgentRegistry.from(json);
  }

  get(agentId: string): RegisteredAgent | undefined {
    return this.agents.get(agentId);
  }

  get size(): number {
    return this.agents.size;
  }
}

function parseConfigError(field: string, message: string): WritError {
  return new WritError("config_invalid", `invalid agent registry: ${field}: ${message}`, { retriable: false, context: { field } });
}
