import { readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, expect, it, vi } from "vitest";
import { COMMANDS } from "../../src/cli/commands.ts";
import { clientSettingsFromEnv, commandLogger, groupIdFromEnv, intFlag, maxMessageBytesFromEnv, msFlag, replyPrefixFromEnv, topicFromEnv, UsageError } from "../../src/cli/common.ts";
import { table } from "../../src/cli/escalations.ts";
import { decodeRecord, formatRecord } from "../../src/cli/tail.ts";
import { RECORD_MAX_DEPTH, WireCodec } from "../../src/codec.ts";
import { UNREADABLE_BATCH_HEADER } from "../../src/kafka/unreadable-batches.ts";
import { shownUrl } from "../../src/cli/verify.ts";
import { decisionLine } from "../../src/console/command.ts";
import { formatDoctorReport } from "../../src/doctor/doctor.ts";
import { logLevelFromEnv } from "../../src/logger.ts";
import { jsonLine, printable } from "../../src/printable.ts";
import { prose } from "../helpers/markdown.ts";
import { nested } from "../helpers/nested.ts";

describe("each command's flags: what it parses, what its usage says and what the docs give it", () => {
  const root = resolve(import.meta.dirname, "..", "..");
  const commands = Promise.all(Object.entries(COMMANDS).map(async ([name, c]) => [name, await c.load()] as const));
  /** A command's flags, long and short, -h/--help included. */
  const flagsOf = (options: Record<string, { short?: string }>): Set<string> =>
    new Set(["help", "h", ...Object.entries(options).flatMap(([long, o]) => (o.short === undefined ? [long] : [long, o.short]))]);
  const flagsIn = (text: string): string[] => [...text.matchAll(/(?<![\w-])--?([a-z][a-z-]*[a-z]|[a-z])(?![\w-])/g)].map((m) => m[1]!);

  it("finds the commands", async () => {
    expect((await commands).length).toBeGreaterThanOrEqual(10);
  });

  it("the usage of each command that imports a tools module with --tools names the variable that bounds the import (verify has --module-timeout-ms)", async () => {
    const byName = new Map(await commands);
    for (const name of ["owner", "submit"]) expect(byName.get(name)!.usage, name).toContain("WRIT_TOOLS_IMPORT_TIMEOUT_MS");
    expect(byName.get("verify")!.usage).toContain("--module-timeout-ms");
  });

  it("every flag a command parses is in its usage, and every flag its usage defines (synopsis, option lines) it parses", async () => {
    const problems: string[] = [];
    for (const [name, command] of await commands) {
      const parsed = flagsOf(command.options);
      for (const flag of Object.keys(command.options)) if (!command.usage.includes(`--${flag}`)) problems.push(`writ ${name}: --${flag} is not in its usage`);
      const [synopsis = "", ...rest] = command.usage.split("\n\n");
      const optionLines = rest.join("\n").split("\n").flatMap((line) => /^\s+((?:-\w, )?--[a-z][a-z-]*)/.exec(line)?.[1] ?? []);
      for (const flag of flagsIn(`${synopsis}\n${optionLines.join("\n")}`)) if (!parsed.has(flag)) problems.push(`writ ${name}: its usage defines --${flag}, which it does not parse`);
    }
    expect(problems).toEqual([]);
  });

  it("the flags README.md, python/README.md and docs/*.md give a writ command (in code) are flags it parses", async () => {
    const byName = new Map(await commands);
    const docs = ["README.md", join("python", "README.md"), ...readdirSync(join(root, "docs")).filter((f) => f.endsWith(".md")).map((f) => join("docs", f))];
    const invocation = new RegExp(`\\bwrit (${[...byName.keys()].join("|")})\\b([^\`|;&#]*)`, "g");
    const problems: string[] = [];
    let seen = 0;
    for (const doc of docs) {
      const text = readFileSync(join(root, doc), "utf8");
      // the code in it: fenced blocks (what prose() leaves out) and inline code spans
      const fenced = [...text.matchAll(/^(```|~~~)[^\n]*\n([\s\S]*?)^\1/gm)].flatMap((m) => m[2]!.split("\n"));
      const code = [...fenced, ...[...prose(text).matchAll(/`([^`\n]+)`/g)].map((m) => m[1]!)];
      for (const snippet of code) {
        for (const m of snippet.matchAll(invocation)) {
          const parsed = flagsOf(byName.get(m[1]!)!.options);
          for (const flag of flagsIn(m[2]!)) {
            seen++;
            if (!parsed.has(flag)) problems.push(`${doc}: writ ${m[1]} … --${flag}`);
          }
        }
      }
    }
    expect(seen).toBeGreaterThan(30);
    expect(problems).toEqual([]);
  });
});

describe("intFlag, msFlag", () => {
  it("takes an integer within its bounds and names the flag otherwise", () => {
    expect(intFlag("lines", undefined, 10)).toBe(10);
    expect(intFlag("lines", "0", 10)).toBe(0);
    expect(intFlag("port", "65535", 39200, 0, 65535)).toBe(65535);
    expect(() => intFlag("port", "65536", 39200, 0, 65535)).toThrow(/--port must be an integer from 0 to 65535, got 65536/);
    expect(() => intFlag("keep", "0", 100, 1)).toThrow(UsageError);
    expect(() => intFlag("lines", "0x10", 10)).toThrow(/--lines/);
  });

  it("refuses a duration past Node's longest timer (writ submit --timeout-ms 3000000000 would answer unknown at once)", () => {
    expect(msFlag("timeout-ms", "2147483647", 30_000, 1)).toBe(2_147_483_647);
    expect(() => msFlag("timeout-ms", "3000000000", 30_000, 1)).toThrow(/--timeout-ms must be an integer from 1 to 2147483647, got 3000000000/);
    expect(() => msFlag("discover-ms", "2147483648", 5000, 100)).toThrow(UsageError);
  });
});

describe("settings the commands share with owners, from the owners' variables", () => {
  /** Runs `body` with these variables set (undefined: unset), then restores the environment. */
  const withEnv = (vars: Record<string, string | undefined>, body: () => void): void => {
    for (const [name, value] of Object.entries(vars)) vi.stubEnv(name, value);
    try {
      body();
    } finally {
      vi.unstubAllEnvs();
    }
  };

  it("checks them as owners do, naming the variable (a newline in a topic name, a prefix with '/', 0x50 as a number)", () => {
    withEnv({ WRIT_HUMAN_TOPIC: "writ.human\nforged", WRIT_REPLY_TOPIC_PREFIX: "replies/", WRIT_GROUP_ID: "owners\x1b[2J", WRIT_MAX_INTENT_BYTES: "100" }, () => {
      expect(() => topicFromEnv("WRIT_HUMAN_TOPIC")).toThrow(/^WRIT_HUMAN_TOPIC: a Kafka topic name, got "writ.human\\x0aforged"$/);
      expect(() => replyPrefixFromEnv()).toThrow(/^WRIT_REPLY_TOPIC_PREFIX: the start of a Kafka topic name/);
      expect(() => groupIdFromEnv()).toThrow(/^WRIT_GROUP_ID: .*got "owners\\x1b\[2J"$/);
      expect(() => clientSettingsFromEnv()).toThrow(/^WRIT_MAX_INTENT_BYTES: /);
    });
    withEnv({ WRIT_MAX_JSON_DEPTH: "0x50" }, () => expect(() => clientSettingsFromEnv()).toThrow(/^WRIT_MAX_JSON_DEPTH: .*got "0x50"$/));
    withEnv({ WRIT_REPLICATION_FACTOR: "0" }, () => expect(() => clientSettingsFromEnv()).toThrow(/^WRIT_REPLICATION_FACTOR: at least 1, got 0$/));
  });

  it("words a bad number as the owner does (what the setting takes and what it got), not in zod's own words", () => {
    withEnv({ WRIT_MAX_JSON_DEPTH: "200" }, () => expect(() => clientSettingsFromEnv()).toThrow(/^WRIT_MAX_JSON_DEPTH: at most 128, got 200$/));
    withEnv({ WRIT_MAX_JSON_DEPTH: "deep" }, () => expect(() => clientSettingsFromEnv()).toThrow(/^WRIT_MAX_JSON_DEPTH: a whole number, got "deep"$/));
    withEnv({ WRIT_MAX_INTENT_BYTES: "1.5" }, () => expect(() => clientSettingsFromEnv()).toThrow(/^WRIT_MAX_INTENT_BYTES: a whole number, got 1.5$/));
    // what writ dlq redrive sizes its produce requests by
    withEnv({ WRIT_MAX_MESSAGE_BYTES: "1000" }, () => expect(() => maxMessageBytesFromEnv()).toThrow(/^WRIT_MAX_MESSAGE_BYTES: at least 16384, got 1000$/));
    withEnv({ WRIT_MAX_MESSAGE_BYTES: "" }, () => expect(maxMessageBytesFromEnv()).toBe(1_000_000));
  });

  it("takes the values owners take, and the owners' defaults when unset or empty", () => {
    withEnv({ WRIT_LEDGER_TOPIC: "", WRIT_DLQ_TOPIC: "acme.dlq", WRIT_REPLY_TOPIC_PREFIX: "acme.replies-", WRIT_MAX_INTENT_BYTES: "524288", WRIT_MAX_JSON_DEPTH: "", WRIT_REPLICATION_FACTOR: "3" }, () => {
      expect([topicFromEnv("WRIT_LEDGER_TOPIC"), topicFromEnv("WRIT_DLQ_TOPIC"), replyPrefixFromEnv()]).toEqual(["writ.ledger", "acme.dlq", "acme.replies-"]);
      // the reply topic a command creates gets the owners' replication factor (one replica is refused where min.insync.replicas is 2)
      // and the owners' reply prefix, which the client checks its reply topic against
      expect(clientSettingsFromEnv()).toEqual({ maxIntentBytes: 524_288, replicationFactor: 3, replyTopicPrefix: "acme.replies-" });
    });
    withEnv({ WRIT_MAX_INTENT_BYTES: undefined, WRIT_MAX_JSON_DEPTH: undefined, WRIT_REPLICATION_FACTOR: undefined, WRIT_REPLY_TOPIC_PREFIX: undefined }, () =>
      expect(clientSettingsFromEnv()).toEqual({ replyTopicPrefix: "writ.replies." }),
    );
  });
});

describe("human-readable output of record-derived text", () => {
  const ESC = "\x1b";
  const evil = `T-1${ESC}]52;c;ZWNobyBwd25lZA==\x07${ESC}[2J${ESC}[1;31mFAKE${ESC}[0m\u202e\x9b`;
  const at = "2026-12-04T00:00:00.000Z";
  const where = { topic: "writ.dlq", partition: 0, offset: "5", timestamp: at };

  it("printable shows controls and bidi overrides as escapes and leaves other text alone", () => {
    expect(printable(`a${ESC}[2Jb\r\n\u202e\u2066\x9b\x7f é €`)).toBe("a\\x1b[2Jb\\x0d\\x0a\\u202e\\u2066\\x9b\\x7f é €");
  });

  it("formatRecord: a dead letter's key and a reply's entity id cannot drive the terminal", () => {
    const dl = { reason: "key_mismatch", message: "m", source: { topic: "writ.intents", partition: 0, offset: "5" }, key: `a${ESC}[2Jb`, originalBytes: 0, truncated: false, at };
    const dlLine = formatRecord("DeadLetter", { ...where, key: "x", value: dl });
    expect(dlLine).not.toContain(ESC);
    expect(dlLine).toContain("key=a\\x1b[2Jb");
    const reply = { status: "applied", intentId: "i1", intentKey: "k".repeat(64), duplicate: false, at, entity: { type: "ticket", id: evil }, version: "v1", via: "patch" };
    const replyLine = formatRecord("Reply", { ...where, key: "x", value: reply });
    expect(replyLine).not.toMatch(/[\x00-\x1f\x7f-\x9f\u202a-\u202e]/);
    expect(replyLine).toContain("ticket:T-1\\x1b]52;c;");
    // An undecodable record's key and the decoder's message (which may quote the record's field names).
    expect(formatRecord("Reply", { ...where, key: evil, error: `schema_invalid: unrecognized key "${ESC}]0;pwned\x07"` })).not.toContain(ESC);
  });

  it("formatRecord: a remembered refusal shows its reason and the refused intent's key, not its digest key", () => {
    const refusal = {
      kind: "intent",
      intentKey: `__refused__:${"d".repeat(64)}`,
      intentId: "i-9",
      status: "done",
      entity: { type: "ticket", id: "T-1" },
      tool: "tag_ticket",
      fingerprint: "d".repeat(64),
      attempts: [],
      cycles: 0,
      outcome: { status: "rejected", reason: "leased", message: "leased", at },
      replyTo: "writ.replies.a",
      updatedAt: at,
      refusedIntentKey: "e".repeat(64),
    };
    const line = formatRecord("LedgerEntry", { ...where, key: "x", value: refusal });
    expect(line).toMatch(/ refused leased ticket:T-1 tool=tag_ticket key=eeeeeeeeeeee\S* intent=i-9$/);
    expect(line).not.toContain("__refused__");
  });

  it("formatRecord: a held lease shows its expiry; a released one, its release and the replay marks it keeps", () => {
    const lease = { kind: "lease", entity: { type: "ticket", id: "T-1" }, change: "c".repeat(64), agentId: "a", replyTo: "writ.replies.a", acquiredAt: at, expiresAt: at, updatedAt: at };
    expect(formatRecord("LedgerEntry", { ...where, key: "x", value: lease })).toContain(`expires=${at}`);
    const released = { ...lease, releasedAt: at, released: [{ change: "c".repeat(64), agentId: "a", before: at, until: at }] };
    expect(formatRecord("LedgerEntry", { ...where, key: "x", value: released })).toMatch(new RegExp(`released=${at} replay-marks=1$`));
  });

  it("the commands' logger escapes its messages and errors", async () => {
    const written: string[] = [];
    const spy = vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => (written.push(String(chunk)), true));
    try {
      const log = commandLogger("tail");
      log.warn(`writ.dlq[0]@5 skipped: unrecognized key "${ESC}]0;pwned\x07"`);
      log.error({ err: new Error(`bad ${evil}`) }, "failed");
      await new Promise((r) => setImmediate(r));
    } finally {
      spy.mockRestore();
    }
    expect(written.join("")).toContain("writ tail: warn: writ.dlq[0]@5 skipped");
    expect(written.join("")).not.toMatch(/[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e]/);
  });

  it("--json lines escape the C1 controls and bidi overrides JSON.stringify leaves raw, and parse to the same value", () => {
    const value = { entity: { type: "ticket", id: `T\x9b2J\u202e\x85${ESC}` } };
    const line = jsonLine(value);
    expect(line).not.toMatch(/[\x00-\x1f\x7f-\x9f\u202a-\u202e]/);
    expect(JSON.parse(line)).toEqual(value);
  });

  it("the console's log of an operator's decision escapes the escalation's id", () => {
    const line = decisionLine({ escalationId: `e-1${ESC}[2J`, decision: "apply", operator: "ops", status: "applied" });
    expect(line).toBe("writ console: escalation e-1\\x1b[2J: apply by ops: applied\n");
  });

  it("the escalations table and doctor's report escape what records and brokers said", () => {
    const rendered = table([["ENTITY", "MESSAGE"], [`ticket:${evil}`, `m${ESC}[2J`]]);
    expect(rendered).not.toContain(ESC);
    const report = formatDoctorReport({
      ok: false,
      brokers: ["a:1"],
      olderThanMs: 60_000,
      maxTransactionTimeoutMs: 900_000,
      topics: ["writ.ledger"],
      missingTopics: [],
      partitions: 1,
      findings: [
        { topic: "writ.ledger", partition: 0, startOffset: "1", producerId: "7", producerEpoch: 0, coordinatorEpoch: 0, transactionalId: `writ.owners-0${ESC}[2J`, transactionState: "Ongoing", lastTimestamp: 0, idleMs: 120_000, hint: "h" },
      ],
      // principals are whatever the cluster's ACLs name
      acls: {
        status: "warning",
        reason: "foreign_writers",
        message: `User:x${ESC}[2J may write writ.human`,
        owners: ["User:writ-owner"],
        topics: [
          {
            topic: "writ.human",
            role: "human",
            trusted: true,
            writers: [{ principal: `User:x${ESC}[2J`, host: "*", patternType: "literal", resourceName: "writ.human", owner: false }],
            foreign: [`User:x${ESC}[2J`],
            ownersMayWrite: true,
            noAcl: false,
          },
        ],
      },
    });
    expect(report).not.toContain(ESC);
    expect(report).toContain("writ.owners-0\\x1b[2J");
    expect(report).toContain("ACL writ.human: Write allowed to User:x\\x1b[2J (literal writ.human) NOT AN OWNER");
  });
});

describe("reading writ's records back (writ tail, writ escalations, the console)", () => {
  const record = (value: unknown) => ({ topic: "writ.human", partition: 0, offset: "0", timestamp: "0", key: null, value: Buffer.from(typeof value === "string" ? value : JSON.stringify(value)), headers: undefined });

  it("reads an escalation as deep as an owner writes one: an intent of the deepest WRIT_MAX_JSON_DEPTH (128) one level down, a record state of 256 levels two down", async () => {
    const intent = { intentId: "i", intentKey: "0".repeat(64), entity: { type: "ticket", id: "T-1" }, tool: "tag_ticket", agent: { id: "a", runId: "r", stepId: "s" }, baseVersion: '"1"', delta: [{ op: "replace", path: "/tags", value: nested(125) }], params: {}, replyTo: "writ.replies.a", createdAt: "2025-06-01T12:00:00.000Z" };
    const escalation = { escalationId: "esc-1", reason: "conflict_cycles_exhausted", message: "m", intent, cycles: 2, current: { state: { tags: nested(255) }, version: '"2"' }, at: "2025-06-01T12:00:00.000Z" };
    const read = await decodeRecord(new WireCodec({}), "Escalation", record(escalation));
    expect(read.error).toBeUndefined();
    expect(read.value).toMatchObject({ escalationId: "esc-1" });
    // Past what any owner writes: an error, as any undecodable record.
    const deeper = await decodeRecord(new WireCodec({}), "Escalation", record("[".repeat(RECORD_MAX_DEPTH + 1) + "]".repeat(RECORD_MAX_DEPTH + 1)));
    expect(deeper.error).toMatch(/^too_deep: /);
  });

  it("a record batch that could not be read (its stand-in: no value, the writ-unreadable-batch header) is shown as such, not as a tombstone", async () => {
    const standIn = { ...record(""), value: null, headers: { [UNREADABLE_BATCH_HEADER]: Buffer.from("5-9 gzip: inflates past 104857600 bytes") } };
    const read = await decodeRecord(new WireCodec({}), "DeadLetter", standIn);
    expect(read.tombstone).toBeUndefined();
    expect(read.error).toBe("unreadable_batch: the record batch of offsets 5-9 could not be read (gzip: inflates past 104857600 bytes); its records are skipped");
    expect(formatRecord("DeadLetter", read)).toContain("undecodable (unreadable_batch: the record batch of offsets 5-9");
    // A record without a value and without the header is still a tombstone.
    expect(await decodeRecord(new WireCodec({}), "LedgerEntry", { ...standIn, headers: undefined })).toMatchObject({ tombstone: true });
  });
});

describe("writ verify's progress line", () => {
  it("shows the registry URL without its query or fragment, where a gateway's token may sit", () => {
    expect(shownUrl("https://registry.example:8081/apis/ccompat/v7?token=s3cret")).toBe("https://registry.example:8081/apis/ccompat/v7 (query not shown)");
    expect(shownUrl("https://registry.example/#s3cret")).not.toContain("s3cret");
    expect(shownUrl("http://127.0.0.1:18081/apis/ccompat/v7")).toBe("http://127.0.0.1:18081/apis/ccompat/v7");
    expect(shownUrl("not a url s3cret")).toBe("(not a URL)");
  });
});

describe("writ owner without Kafka", () => {
  it("says KAFKA_BROKERS is not set and how to give it, as the other commands do (exit 2)", async () => {
    const { ownerCommand } = await import("../../src/cli/owner.ts");
    const written: string[] = [];
    const stderr = vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => (written.push(String(chunk)), true));
    vi.stubEnv("KAFKA_BROKERS", undefined);
    vi.stubEnv("WRIT_TOOLS_MODULE", undefined);
    try {
      expect(await ownerCommand.main(["--tools", "./tools.js"])).toBe(2);
      expect(written.join("")).toBe("writ owner: no Kafka: give --brokers host:port[,…] (or set KAFKA_BROKERS)\n");
      written.length = 0;
      vi.stubEnv("KAFKA_BROKERS", "  ");
      expect(await ownerCommand.main(["--tools", "./tools.js"])).toBe(2);
      expect(written.join("")).toContain("no Kafka: give --brokers");
      // given: the next thing missing is said instead
      written.length = 0;
      expect(await ownerCommand.main(["--brokers", "127.0.0.1:9", "--tools", "/nonexistent/tools.js"])).toBe(2);
      expect(written.join("")).toContain("tools module /nonexistent/tools.js (--tools) not found");
    } finally {
      stderr.mockRestore();
      vi.unstubAllEnvs();
    }
  });
});

describe("LOG_LEVEL", () => {
  it("a level pino does not know stops writ owner and the commands at start, one line naming LOG_LEVEL (exit 2), not pino's stack trace", async () => {
    const { ownerCommand } = await import("../../src/cli/owner.ts");
    const { tailCommand } = await import("../../src/cli/tail.ts");
    const { doctorCommand } = await import("../../src/cli/doctor.ts");
    const written: string[] = [];
    const stderr = vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => (written.push(String(chunk)), true));
    vi.stubEnv("LOG_LEVEL", "verbose");
    const said = 'invalid configuration: LOG_LEVEL: one of trace, debug, info, warn, error, fatal, silent, got "verbose"\n';
    try {
      expect(await ownerCommand.main(["--brokers", "127.0.0.1:9", "--tools", "/nonexistent/tools.js"])).toBe(2);
      expect(written.join("")).toBe(`writ owner: ${said}`);
      written.length = 0;
      expect(await tailCommand.main(["replies", "--brokers", "127.0.0.1:9"])).toBe(2);
      expect(written.join("")).toBe(`writ tail: ${said}`);
      written.length = 0;
      expect(await doctorCommand.main(["--brokers", "127.0.0.1:9"])).toBe(2);
      expect(written.join("")).toBe(`writ doctor: ${said}`);
    } finally {
      stderr.mockRestore();
      vi.unstubAllEnvs();
    }
  });

  it("takes pino's levels and silent; unset or empty is the caller's default", () => {
    for (const level of ["trace", "debug", "info", "warn", "error", "fatal", "silent"]) expect(logLevelFromEnv("info", { LOG_LEVEL: level })).toBe(level);
    expect(logLevelFromEnv("warn", {})).toBe("warn");
    expect(logLevelFromEnv("warn", { LOG_LEVEL: "" })).toBe("warn");
    // Any case and surrounding blanks, as pino itself took them before the check (a shared LOG_LEVEL=INFO).
    expect(logLevelFromEnv("warn", { LOG_LEVEL: "INFO" })).toBe("info");
    expect(logLevelFromEnv("warn", { LOG_LEVEL: " Debug " })).toBe("debug");
    expect(() => logLevelFromEnv("info", { LOG_LEVEL: "INFO\x1b[2J" })).toThrow(/^invalid configuration: LOG_LEVEL: one of .*, got "INFO\\x1b\[2J"$/);
  });
});

describe("writ submit --intent", () => {
  /** `writ submit --intent <intent>` with a key scope and no reachable broker: its exit status and stderr. */
  const submitWith = async (intent: string): Promise<{ code: number; stderr: string }> => {
    const { submitCommand } = await import("../../src/cli/submit.ts");
    const written: string[] = [];
    const stderr = vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => (written.push(String(chunk)), true));
    try {
      const code = await submitCommand.main(["--intent", intent, "--brokers", "127.0.0.1:9", "--key-scope", "run", "--intent-fields", "tag"]);
      return { code, stderr: written.join("") };
    } finally {
      stderr.mockRestore();
    }
  };

  it("refuses fields it does not know, naming them and the field each is close to, before anything connects (exit 2)", async () => {
    const { mkdtempSync, writeFileSync } = await import("node:fs");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const dir = mkdtempSync(join(tmpdir(), "writ-submit-"));
    const intent = { tool: "tag_ticket", entity: "ticket:T-1", delta: [{ op: "add", path: "/tags/-", value: "vip" }], params: { tag: "vip" }, runId: "r", stepId: "s" };
    const run = async (fields: Record<string, unknown>): Promise<{ code: number; stderr: string }> => {
      const file = join(dir, `${Object.keys(fields).join("-")}.json`);
      writeFileSync(file, JSON.stringify({ ...intent, ...fields }));
      return submitWith(file);
    };
    const typo = await run({ baseVerison: '"v1"' });
    expect(typo.code).toBe(2);
    expect(typo.stderr).toContain("writ submit: --intent: unknown field baseVerison (did you mean baseVersion?); an intent gives tool, entity, baseVersion, delta, params, runId, stepId, toolCallId");
    expect(typo.stderr).not.toContain("missing --base-version");
    const two = await run({ baseVersion: '"v1"', run_id: "r", colour: "red" });
    expect(two.stderr).toContain("unknown fields run_id (did you mean runId?), colour;");
  });

  it("takes the intent as inline JSON when the value starts with { (as --delta and --params take theirs), not as a file name", async () => {
    const run = submitWith;
    // read as the intent: its fields are checked (a file named so would be "no such file")
    const typo = await run(' {"tool":"tag_ticket","entity":"ticket:T-1","baseVerison":"\\"v1\\"","delta":[],"runId":"r","stepId":"s"}');
    expect(typo.code).toBe(2);
    expect(typo.stderr).toContain("--intent: unknown field baseVerison (did you mean baseVersion?)");
    expect(typo.stderr).not.toContain("ENOENT");
    const missing = await run('{"tool":"tag_ticket","entity":"ticket:T-1","params":{"tag":"vip"},"runId":"r","stepId":"s"}');
    expect(missing.stderr).toContain("missing --base-version, --delta (or the same fields in --intent)");
    const broken = await run('{"tool":');
    expect(broken.code).toBe(2);
    expect(broken.stderr).toContain("--intent (inline JSON) is not JSON:");
    // anything else is still a path
    const file = await run("no-such-intent.json");
    expect(file.stderr).toContain("--intent no-such-intent.json: ENOENT");
  });
});

describe("--signing-key of the commands that send (submit, undo, escalations resolve, console)", () => {
  it("a key file that is missing, not an Ed25519 private key, or a bad --key-id is a usage error naming the flag, before anything connects, never quoting the file (exit 2)", async () => {
    const { mkdtempSync, writeFileSync } = await import("node:fs");
    const { generateKeyPairSync } = await import("node:crypto");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const { submitCommand } = await import("../../src/cli/submit.ts");
    const { undoCommand } = await import("../../src/cli/undo.ts");
    const { escalationsCommand } = await import("../../src/cli/escalations.ts");
    const { consoleCommand } = await import("../../src/console/command.ts");
    const dir = mkdtempSync(join(tmpdir(), "writ-signing-key-"));
    const garbage = join(dir, "garbage.pem");
    writeFileSync(garbage, "TOPSECRET-not-a-key-0123456789\n");
    const publicPem = join(dir, "public.pem");
    const pair = generateKeyPairSync("ed25519");
    writeFileSync(publicPem, pair.publicKey.export({ format: "pem", type: "spki" }));
    const good = join(dir, "agent.pem");
    writeFileSync(good, pair.privateKey.export({ format: "pem", type: "pkcs8" }));
    const missing = join(dir, "missing.pem");
    const commands: [string, (key: string, keyId: string) => Promise<number>][] = [
      ["submit", (key, keyId) => submitCommand.main(["--brokers", "127.0.0.1:9", "--tool", "tag_ticket", "--entity", "ticket:T-1", "--base-version", '"v1"', "--delta", '[{"op":"add","path":"/tags/-","value":"vip"}]', "--params", '{"tag":"vip"}', "--run-id", "r", "--step-id", "s", "--key-scope", "run", "--intent-fields", "tag", "--signing-key", key, "--key-id", keyId])],
      // without --entity/--tool, undo reads the ledger first: the key must be checked before that
      ["undo", (key, keyId) => undoCommand.main(["a".repeat(64), "--brokers", "127.0.0.1:9", "--signing-key", key, "--key-id", keyId])],
      ["escalations", (key, keyId) => escalationsCommand.main(["resolve", "esc-1", "--discard", "--brokers", "127.0.0.1:9", "--signing-key", key, "--key-id", keyId])],
      ["console", (key, keyId) => consoleCommand.main(["--brokers", "127.0.0.1:9", "--token", "t".repeat(16), "--operator-token", "o".repeat(16), "--port", "0", "--signing-key", key, "--key-id", keyId])],
    ];
    const written: string[] = [];
    const stderr = vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => (written.push(String(chunk)), true));
    try {
      for (const [name, run] of commands) {
        for (const [key, keyId, expected] of [
          [missing, "k1", `writ ${name}: --signing-key ${missing} cannot be read (ENOENT)`],
          [garbage, "k1", `writ ${name}: --signing-key ${garbage}: signing key (privateKey) must be an Ed25519 private key`],
          [publicPem, "k1", `writ ${name}: --signing-key ${publicPem}: signing key (privateKey) must be an Ed25519 private key`],
          [good, "bad key id", `writ ${name}: --key-id: signing key id must be`],
        ] as const) {
          written.length = 0;
          expect(await run(key, keyId), `${name} ${key}`).toBe(2);
          const out = written.join("");
          expect(out).toContain(expected);
          expect(out).not.toContain("TOPSECRET");
          expect(out, "nothing connected").not.toMatch(/Kafka|ECONNREFUSED/);
        }
      }
    } finally {
      stderr.mockRestore();
    }
  }, 120_000);
});

describe("--audience of the commands that sign (signingFromFlags)", () => {
  it("--audience, else $WRIT_SIGNING_AUDIENCE when signing; --audience without a key, or one outside the alphabet, is a usage error naming the flag; a bad variable names the variable", async () => {
    const { mkdtempSync, writeFileSync } = await import("node:fs");
    const { generateKeyPairSync } = await import("node:crypto");
    const { tmpdir } = await import("node:os");
    const { signingFromFlags } = await import("../../src/cli/common.ts");
    const key = join(mkdtempSync(join(tmpdir(), "writ-audience-")), "agent.pem");
    writeFileSync(key, generateKeyPairSync("ed25519").privateKey.export({ format: "pem", type: "pkcs8" }));
    const signing = { "signing-key": key, "key-id": "k1" };
    try {
      vi.stubEnv("WRIT_SIGNING_AUDIENCE", undefined);
      expect(signingFromFlags({})).toEqual({});
      expect(signingFromFlags(signing)).not.toHaveProperty("audience");
      expect(signingFromFlags({ ...signing, audience: "acme:billing/prod-eu-1" }).audience).toBe("acme:billing/prod-eu-1");
      expect(() => signingFromFlags({ audience: "prod" })).toThrow(UsageError);
      // The key file is a regular file, read bounded: a device or a FIFO is refused unread (/dev/zero has no end).
      expect(() => signingFromFlags({ "signing-key": "/dev/zero", "key-id": "k1" })).toThrow(/^--signing-key \/dev\/zero is not a regular file/);
      expect(() => signingFromFlags({ "signing-key": `${key}.missing`, "key-id": "k1" })).toThrow(/^--signing-key .*agent\.pem\.missing cannot be read \(ENOENT\)$/);
      expect(() => signingFromFlags({ audience: "prod" })).toThrow(/--audience goes with --signing-key and --key-id/);
      expect(() => signingFromFlags({ ...signing, audience: "prod\u001b[2J" })).toThrow(/^--audience: 1–128 of A-Z a-z 0-9 \. _ : \/ -, got "prod\\x1b\[2J"$/);
      vi.stubEnv("WRIT_SIGNING_AUDIENCE", "prod");
      expect(signingFromFlags(signing).audience).toBe("prod");
      expect(signingFromFlags({ ...signing, audience: "staging" }).audience).toBe("staging");
      // Not signing: the owners' variable in a shared environment gives an unsigned command no audience.
      expect(signingFromFlags({})).toEqual({});
      vi.stubEnv("WRIT_SIGNING_AUDIENCE", "prod eu");
      expect(() => signingFromFlags(signing)).toThrow(expect.objectContaining({ code: "config_invalid", context: { field: "WRIT_SIGNING_AUDIENCE" } }));
    } finally {
      vi.unstubAllEnvs();
    }
  });
});

describe("writ console's tokens", () => {
  it("a token too short, or the operator's the same as the read-only one, is refused naming its flag or variable (exit 2)", async () => {
    const { consoleCommand } = await import("../../src/console/command.ts");
    const written: string[] = [];
    const stderr = vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => (written.push(String(chunk)), true));
    const run = async (argv: string[], env: Record<string, string | undefined>): Promise<string> => {
      written.length = 0;
      for (const [name, value] of Object.entries(env)) vi.stubEnv(name, value);
      try {
        expect(await consoleCommand.main(["--brokers", "127.0.0.1:9", ...argv])).toBe(2);
        return written.join("");
      } finally {
        vi.unstubAllEnvs();
      }
    };
    const long = "t".repeat(16);
    try {
      expect(await run([], { WRIT_CONSOLE_TOKEN: "short" })).toBe("writ console: WRIT_CONSOLE_TOKEN must be at least 16 characters (it is 5)\n");
      expect(await run(["--token", "short"], { WRIT_CONSOLE_TOKEN: undefined })).toBe("writ console: --token must be at least 16 characters (it is 5)\n");
      expect(await run([], { WRIT_CONSOLE_TOKEN: long, WRIT_CONSOLE_OPERATOR_TOKEN: "op" })).toBe("writ console: WRIT_CONSOLE_OPERATOR_TOKEN must be at least 16 characters (it is 2)\n");
      expect(await run(["--operator-token", long], { WRIT_CONSOLE_TOKEN: long })).toBe("writ console: --operator-token must differ from the read-only token\n");
    } finally {
      stderr.mockRestore();
    }
  });
});

describe("writ console's address", () => {
  it("a --port in use or a --host that is not this machine's is a usage error naming the flag, before anything connects (exit 2)", async () => {
    const { createServer } = await import("node:net");
    const { consoleCommand } = await import("../../src/console/command.ts");
    const holder = createServer();
    await new Promise<void>((resolve) => holder.listen(0, "127.0.0.1", resolve));
    const held = (holder.address() as { port: number }).port;
    const written: string[] = [];
    const stderr = vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => (written.push(String(chunk)), true));
    try {
      for (const [flags, expected] of [
        [["--port", String(held)], `writ console: --port ${held}: the console cannot listen on 127.0.0.1:${held}: the port is in use (EADDRINUSE)`],
        [["--host", "no-such-host.invalid", "--port", "0"], "writ console: --host no-such-host.invalid: the console cannot listen on no-such-host.invalid:0: the host is not an address of this machine"],
      ] as const) {
        written.length = 0;
        // 127.0.0.1:9 refuses: a console that connected first would retry there instead of answering
        expect(await consoleCommand.main(["--brokers", "127.0.0.1:9", "--token", "t".repeat(16), ...flags])).toBe(2);
        const out = written.join("");
        expect(out).toContain(expected);
        expect(out, "nothing connected").not.toMatch(/Kafka|ECONNREFUSED/);
      }
    } finally {
      stderr.mockRestore();
      holder.close();
    }
  }, 60_000);
});
