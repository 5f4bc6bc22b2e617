// The MCP server process reads the owners' admission bounds under the owners'
// variable names (producers/mcp-main.ts). Its configuration is checked before
// anything connects, so a bad value shows without a broker. And how it exits on a
// signal before it serves.
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { generateKeyPairSync } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { describe, expect, it, onTestFinished } from "vitest";
import { waitFor } from "../../helpers/wait-for.ts";

/**
 * Runs the MCP server with `env` until it exits (killed if it has not within waitFor's bound): its stderr and
 * exit. `onStderr` sees its stderr so far at each chunk.
 */
async function runMcpMain(env: Record<string, string>, onStderr: (stderr: string, child: ChildProcess) => void = () => undefined, args: string[] = ["--stdio"]) {
  const child = spawn(process.execPath, [resolve(import.meta.dirname, "../../../producers/mcp-main.ts"), ...args], {
    env: { PATH: process.env.PATH ?? "", KAFKA_BROKERS: "127.0.0.1:9", LOG_LEVEL: "error", ...env },
    stdio: ["pipe", "ignore", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (chunk: Buffer) => ((stderr += chunk.toString()), onStderr(stderr, child)));
  let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  child.on("exit", (code, signal) => (exit = { code, signal }));
  try {
    await waitFor(() => exit, { timeoutMs: 20_000, message: () => `the MCP server did not exit; stderr: ${stderr}` });
  } finally {
    if (!exit) child.kill("SIGKILL");
  }
  return { stderr, ...exit! };
}

/** An onStderr of {@link runMcpMain} that sends SIGTERM once `line` is on stderr: the start got that far. */
const stopAt = (line: string) => (stderr: string, child: ChildProcess) => void (stderr.includes(line) && child.kill("SIGTERM"));

async function mcpMainStderr(env: Record<string, string>): Promise<string> {
  return (await runMcpMain(env)).stderr;
}

/** A WRIT_TOOL_SPECS_MODULE whose body is `code`. */
function specsModule(code: string): string {
  const dir = mkdtempSync(join(tmpdir(), "writ-mcp-specs-"));
  onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, "specs.mjs"), code);
  return join(dir, "specs.mjs");
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

  it("signs with WRIT_MCP_SIGNING_KEY_FILE and WRIT_MCP_KEY_ID, together, checked before anything connects, naming the variable and never quoting the file", async () => {
    const dir = mkdtempSync(join(tmpdir(), "writ-mcp-key-"));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    const key = generateKeyPairSync("ed25519");
    const privatePem = join(dir, "agent.pem");
    writeFileSync(privatePem, key.privateKey.export({ type: "pkcs8", format: "pem" }));
    const publicPem = join(dir, "agent.pub.pem");
    writeFileSync(publicPem, key.publicKey.export({ type: "spki", format: "pem" }));
    const secretish = join(dir, "not-a-key");
    writeFileSync(secretish, "hunter2-is-not-a-key\n");

    expect(await mcpMainStderr({ WRIT_MCP_SIGNING_KEY_FILE: privatePem })).toContain("WRIT_MCP_KEY_ID: WRIT_MCP_SIGNING_KEY_FILE and WRIT_MCP_KEY_ID go together");
    expect(await mcpMainStderr({ WRIT_MCP_KEY_ID: "k1" })).toContain("WRIT_MCP_SIGNING_KEY_FILE: WRIT_MCP_SIGNING_KEY_FILE and WRIT_MCP_KEY_ID go together");
    expect(await mcpMainStderr({ WRIT_MCP_SIGNING_KEY_FILE: join(dir, "missing.pem"), WRIT_MCP_KEY_ID: "k1" })).toContain("WRIT_MCP_SIGNING_KEY_FILE: " + join(dir, "missing.pem") + " cannot be read (ENOENT)");
    expect(await mcpMainStderr({ WRIT_MCP_SIGNING_KEY_FILE: publicPem, WRIT_MCP_KEY_ID: "k1" })).toMatch(/WRIT_MCP_SIGNING_KEY_FILE: .*agent.pub.pem: signing key \(privateKey\) must be an Ed25519 private key/);
    const unreadable = await mcpMainStderr({ WRIT_MCP_SIGNING_KEY_FILE: secretish, WRIT_MCP_KEY_ID: "k1" });
    expect(unreadable).toMatch(/WRIT_MCP_SIGNING_KEY_FILE: .*must be an Ed25519 private key/);
    expect(unreadable).not.toContain("hunter2");
    expect(await mcpMainStderr({ WRIT_MCP_SIGNING_KEY_FILE: privatePem, WRIT_MCP_KEY_ID: "k 1" })).toContain("WRIT_MCP_KEY_ID: signing key id must be");
    // /proc/self/environ is a regular file whose size says 0: only the bounded read finds it too large.
    expect(await mcpMainStderr({ WRIT_MCP_SIGNING_KEY_FILE: "/proc/self/environ", WRIT_MCP_KEY_ID: "k1", PAD: "x".repeat(20_000) })).toContain(
      "WRIT_MCP_SIGNING_KEY_FILE: /proc/self/environ is larger than 16384 bytes",
    );
    writeFileSync(join(dir, "big"), "x".repeat(20_000));
    expect(await mcpMainStderr({ WRIT_MCP_SIGNING_KEY_FILE: join(dir, "big"), WRIT_MCP_KEY_ID: "k1" })).toContain(`WRIT_MCP_SIGNING_KEY_FILE: ${join(dir, "big")} is larger than 16384 bytes`);
    // Neither a device nor a FIFO is read (their size says nothing: /dev/zero has no end, a FIFO blocks, /dev/stdin
    // is the MCP stream itself).
    expect(await mcpMainStderr({ WRIT_MCP_SIGNING_KEY_FILE: "/dev/zero", WRIT_MCP_KEY_ID: "k1" })).toContain("WRIT_MCP_SIGNING_KEY_FILE: /dev/zero is not a regular file");
    execFileSync("mkfifo", [join(dir, "fifo")]);
    expect(await mcpMainStderr({ WRIT_MCP_SIGNING_KEY_FILE: join(dir, "fifo"), WRIT_MCP_KEY_ID: "k1" })).toContain(`WRIT_MCP_SIGNING_KEY_FILE: ${join(dir, "fifo")} is not a regular file`);
    expect(await mcpMainStderr({ WRIT_MCP_SIGNING_KEY_FILE: dir, WRIT_MCP_KEY_ID: "k1" })).toContain(`WRIT_MCP_SIGNING_KEY_FILE: ${dir} is not a regular file`);
    expect(await mcpMainStderr({ WRIT_MCP_SIGNING_KEY_FILE: privatePem, WRIT_MCP_KEY_ID: "k1", WRIT_SIGNING_AUDIENCE: "prod eu" })).toContain('WRIT_SIGNING_AUDIENCE: 1–128 of A-Z a-z 0-9 . _ : / -, got \\"prod eu\\"');
    // A good key gets past the checks: said at start (its id and audience, never the key), before anything connects.
    const good = await runMcpMain({ WRIT_MCP_SIGNING_KEY_FILE: privatePem, WRIT_MCP_KEY_ID: "k1", WRIT_SIGNING_AUDIENCE: "prod", LOG_LEVEL: "info" }, stopAt("signing intents"));
    expect(good.stderr).toContain('"signs":{"keyId":"k1","audience":"prod"}');
    expect(good.stderr).not.toMatch(/PRIVATE KEY|WRIT_MCP_SIGNING_KEY_FILE|WRIT_MCP_KEY_ID/);
  });

  it("warns at start when it does not sign where the owners check an audience (they then dead-letter every unsigned intent), and of a WRIT_ variable it does not know", async () => {
    // Read only when it signs: a value owners would refuse does not stop a server that does not sign.
    const unsigned = await runMcpMain({ WRIT_SIGNING_AUDIENCE: "prod eu", WRIT_MCP_SIGNING_KEYFILE: "/keys/agent.pem", LOG_LEVEL: "info" }, stopAt("unknown setting"));
    expect(unsigned.stderr).toContain('"signs":false');
    expect(unsigned.stderr).toContain("WRIT_SIGNING_AUDIENCE is set but the server has no signing key (WRIT_MCP_SIGNING_KEY_FILE, WRIT_MCP_KEY_ID)");
    expect(unsigned.stderr).toContain("unknown setting WRIT_MCP_SIGNING_KEYFILE (did you mean WRIT_MCP_SIGNING_KEY_FILE?)");
    expect(unsigned.stderr).not.toContain("1–128");
    // The hint comes before the refusal of the pair a misspelt name belongs to.
    const dir = mkdtempSync(join(tmpdir(), "writ-mcp-key-"));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    writeFileSync(join(dir, "agent.pem"), generateKeyPairSync("ed25519").privateKey.export({ type: "pkcs8", format: "pem" }));
    const misspelt = await mcpMainStderr({ WRIT_MCP_SIGNING_KEY_FILE: join(dir, "agent.pem"), WRIT_MCP_KEYID: "k1", LOG_LEVEL: "warn" });
    expect(misspelt).toContain("unknown setting WRIT_MCP_KEYID (did you mean WRIT_MCP_KEY_ID?)");
    expect(misspelt).toContain("WRIT_MCP_KEY_ID: WRIT_MCP_SIGNING_KEY_FILE and WRIT_MCP_KEY_ID go together");
    // Set but empty (a templating slip): unset, and said.
    const empty = await runMcpMain({ WRIT_MCP_SIGNING_KEY_FILE: "", WRIT_MCP_KEY_ID: "", LOG_LEVEL: "info" }, stopAt("not signing intents"));
    expect(empty.stderr).toContain("WRIT_MCP_SIGNING_KEY_FILE is set but empty, so not set");
    expect(empty.stderr).toContain("WRIT_MCP_KEY_ID is set but empty, so not set");
  });

  it("checks the tools module's record readers before anything connects", async () => {
    const module = specsModule(
      'import { specs } from ' + JSON.stringify(resolve(import.meta.dirname, "../../../examples/demo-tool-specs.ts")) + ';\nexport { specs };\nexport const readers = () => [];\n',
    );
    const exit = await runMcpMain({ WRIT_TOOL_SPECS_MODULE: module });
    expect(exit.code).toBe(1);
    expect(exit.stderr).toMatch(/tool [a-z_]+: no record reader named/);
    // Before, the client connected first: the unreachable broker's error came instead, the readers never checked.
    expect(exit.stderr).not.toMatch(/ECONNREFUSED|Connection error/i);
  });

  it("--http without WRIT_MCP_TOKEN is refused naming it before anything connects", async () => {
    // Before, the client connected (and created its reply topic) first: here the unreachable broker's error came instead.
    const exit = await runMcpMain({}, undefined, ["--http"]);
    expect(exit.code).toBe(1);
    expect(exit.stderr).toContain("WRIT_MCP_TOKEN (token): --http needs a bearer token");
    expect(exit.stderr).not.toMatch(/ECONNREFUSED|KafkaJS|Connection error/i);
  });

  it("refuses WRIT_RUN_ID longer than an intent carries (256 characters), naming it, before anything connects", async () => {
    expect(await mcpMainStderr({ WRIT_RUN_ID: "r".repeat(257) })).toContain("WRIT_RUN_ID (runId)");
  });
});

describe("the MCP server stopped before it serves", () => {
  it("SIGTERM while it starts (its tools module still loading) ends it as killed by the signal (143), not 0", async () => {
    const module = specsModule('process.stderr.write("specs: loading\\n");\nawait new Promise(() => setInterval(() => {}, 1000));\n');
    let sent = false;
    const exit = await runMcpMain({ WRIT_TOOL_SPECS_MODULE: module }, (stderr, child) => {
      if (!sent && stderr.includes("specs: loading")) sent = child.kill("SIGTERM");
    });
    // Before, its stop exited 0: a supervisor took a start cut short for a clean end.
    expect({ code: exit.code, signal: exit.signal }, exit.stderr).toEqual({ code: 143, signal: null });
  });

  it("a signal that comes as its start has failed leaves the failure's exit 1, not 0", async () => {
    // The signal is sent before the module throws; its handler runs once the failure is handled (the next turn of
    // the event loop), inside the 100 ms the failed start waits before it exits.
    const module = specsModule('process.kill(process.pid, "SIGTERM");\nthrow new Error("specs: broken");\n');
    const exit = await runMcpMain({ WRIT_TOOL_SPECS_MODULE: module });
    expect(exit.stderr).toContain("specs: broken");
    expect({ code: exit.code, signal: exit.signal }, exit.stderr).toEqual({ code: 1, signal: null });
  });
});
