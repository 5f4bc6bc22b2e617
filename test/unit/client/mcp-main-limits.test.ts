// The MCP server process reads the owners' admission bounds under the owners'
// variable names (producers/mcp-main.ts). Its configuration is checked before
// anything connects, so a bad value shows without a broker.
import { spawn } from "node:child_process";
import { resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { waitFor } from "../../helpers/wait-for.ts";

/** Runs the MCP server with `env` until it exits (killed if it has not within waitFor's bound); its stderr. */
async function mcpMainStderr(env: Record<string, string>): Promise<string> {
  const child = spawn(process.execPath, [resolve(import.meta.dirname, "../../../producers/mcp-main.ts"), "--stdio"], {
    env: { PATH: process.env.PATH ?? "", KAFKA_BROKERS: "127.0.0.1:9", LOG_LEVEL: "error", ...env },
    stdio: ["pipe", "ignore", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  let exited = false;
  child.on("exit", () => (exited = true));
  try {
    await waitFor(() => exited, { timeoutMs: 20_000, message: () => `the MCP server did not exit; stderr: ${stderr}` });
  } finally {
    if (!exited) child.kill();
  }
  return stderr;
}

describe("the MCP server's configuration, under the owners' variable names where they share a setting", () => {
  it("reads WRIT_MAX_INTENT_BYTES and WRIT_MAX_JSON_DEPTH, and refuses a bad one naming the variable", async () => {
    expect(await mcpMainStderr({ WRIT_MAX_JSON_DEPTH: "0" })).toContain("WRIT_MAX_JSON_DEPTH (maxJsonDepth)");
    expect(await mcpMainStderr({ WRIT_MAX_INTENT_BYTES: "lots" })).toContain("WRIT_MAX_INTENT_BYTES (maxIntentBytes)");
    // The owners' own bounds: a client bound below what owners may take would refuse what they accept.
    expect(await mcpMainStderr({ WRIT_MAX_INTENT_BYTES: "100" })).toContain("WRIT_MAX_INTENT_BYTES (maxIntentBytes)");
  });

  it("checks the topics it names: the owners' reply prefix and its own reply and intents topics", async () => {
    expect(await mcpMainStderr({ WRIT_REPLY_TOPIC_PREFIX: "replies/" })).toContain("WRIT_REPLY_TOPIC_PREFIX (replyTopicPrefix)");
    expect(await mcpMainStderr({ WRIT_MCP_REPLY_TOPIC: "a b" })).toContain("WRIT_MCP_REPLY_TOPIC (replyTopic)");
    expect(await mcpMainStderr({ WRIT_INTENTS_TOPIC: "x\ny" })).toContain("WRIT_INTENTS_TOPIC (intentsTopic)");
  });

  it("refuses a LOG_LEVEL pino does not know in one line naming it, not with pino's stack trace", async () => {
    expect(await mcpMainStderr({ LOG_LEVEL: "verbose" })).toBe('writ-mcp: invalid configuration: LOG_LEVEL: one of trace, debug, info, warn, error, fatal, silent, got "verbose"\n');
  });

  it("refuses WRIT_RUN_ID longer than an intent carries (256 characters), naming it, before anything connects", async () => {
    expect(await mcpMainStderr({ WRIT_RUN_ID: "r".repeat(257) })).toContain("WRIT_RUN_ID (runId)");
  });
});
