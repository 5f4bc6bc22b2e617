// An owner's log lines are JSON objects without a duplicated key: pino appends a child logger's bindings to its
// parent's, and a partition owner's `component` under the router's was written twice ("component":"router", …
// "component":"partition-owner"), which strict log parsers refuse. Each line carries one component, the most
// specific.
import { Writable } from "node:stream";
import { logLevel } from "kafkajs";
import { pino } from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import { kafkaLogCreator, kafkaLogging } from "../../../src/kafka-log.ts";
import { componentLogger } from "../../../src/logger.ts";
import { routerLogger } from "../../../src/owner/router.ts";
import { waitFor } from "../../helpers/wait-for.ts";
import { ownerWith, txns } from "./partition-owner-harness.ts";

vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith() };
});

afterEach(() => {
  txns.length = 0;
});

/** A pino root at debug whose lines (JSON text, as written) land in `lines`. */
function capturing() {
  const lines: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(...chunk.toString("utf8").split("\n").filter((l) => l !== ""));
      done();
    },
  });
  return { root: pino({ level: "debug" }, stream), lines };
}

/**
 * The keys that occur more than once in one object of a JSON text, with their path ("component", "err.type").
 * A scan of the text itself: JSON.parse keeps the last of duplicated keys and says nothing.
 */
function duplicatedKeys(json: string): string[] {
  const found: string[] = [];
  const stack: { keys: Set<string> | null; path: string; key: string }[] = [];
  let i = 0;
  const readString = (): string => {
    const start = i;
    for (i++; json[i] !== '"'; i++) if (json[i] === "\\") i++;
    i++;
    return JSON.parse(json.slice(start, i)) as string;
  };
  while (i < json.length) {
    const c = json[i]!;
    const top = stack.at(-1);
    if (c === "{" || c === "[") {
      const path = top === undefined ? "" : top.keys === null ? top.path : [top.path, top.key].filter((p) => p !== "").join(".");
      stack.push({ keys: c === "{" ? new Set() : null, path, key: "" });
      i++;
    } else if (c === "}" || c === "]") {
      stack.pop();
      i++;
    } else if (c === '"') {
      const s = readString();
      let j = i;
      while (json[j] === " ") j++;
      if (top?.keys && json[j] === ":") {
        if (top.keys.has(s)) found.push([top.path, s].filter((p) => p !== "").join("."));
        top.keys.add(s);
        top.key = s;
      }
    } else i++;
  }
  return found;
}

describe("owner log lines", () => {
  it("the duplicate-key scan finds a key twice in an object, at any depth, and not in strings or arrays", () => {
    expect(duplicatedKeys('{"component":"router","a":1,"component":"partition-owner"}')).toEqual(["component"]);
    expect(duplicatedKeys('{"err":{"type":"E","type":"F"},"x":[{"k":1},{"k":2}],"m":"\\"k\\":1,\\"k\\":2"}')).toEqual(["err.type"]);
    expect(duplicatedKeys('{"a":{"b":1},"c":{"b":2}}')).toEqual([]);
  });

  it("a partition owner's lines under the router's logger, and kafkajs's, carry one component each, the most specific", async () => {
    const { root, lines } = capturing();
    const log = routerLogger(root, "owner-test");
    const owner = ownerWith({ log });
    owner.start();
    await waitFor(() => owner.state === "running", { timeoutMs: 5_000, message: "the owner never opened its partition" });
    await owner.close();
    kafkaLogCreator(log)(logLevel.WARN)({ namespace: "Connection", level: logLevel.WARN, label: "WARN", log: { message: "broker went away", timestamp: "t", logger: "kafkajs" } });
    log.info("router line");

    const restored = lines.find((l) => l.includes("partition restored"));
    expect(restored, lines.join("\n")).toBeDefined();
    for (const line of lines) expect(duplicatedKeys(line), line).toEqual([]);
    const parsed = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(parsed.find((l) => String(l.msg).includes("partition restored"))).toMatchObject({ component: "partition-owner", instance: "owner-test", partition: 0 });
    expect(parsed.find((l) => l.msg === "broker went away")).toMatchObject({ component: "kafkajs", namespace: "Connection", instance: "owner-test" });
    expect(parsed.find((l) => l.msg === "router line")).toMatchObject({ component: "router", instance: "owner-test" });
  });

  // kafkajs 2.2.4's BrokerPool logs a connect that failed for good with the Error itself as the message
  // (`logger.error(e, { retryCount, retryTime, stack })`): taken for a string, the handler threw inside kafkajs's
  // catch, and the client failed with that TypeError instead of the broker's error (an authentication failure).
  it("a kafkajs entry whose message is an Error is logged with its text, and the handler does not throw", () => {
    const { root, lines } = capturing();
    const error = new Error("SASL SCRAM-SHA-512 authentication failed");
    error.name = "KafkaJSSASLAuthenticationError";
    const entry = { namespace: "BrokerPool", level: logLevel.ERROR, label: "ERROR", log: { message: error as unknown as string, timestamp: "t", logger: "kafkajs", retryCount: 0 } };
    expect(() => kafkaLogCreator(root)(logLevel.ERROR)(entry)).not.toThrow();
    const tapped: string[] = [];
    expect(() => kafkaLogging(root, logLevel.ERROR, (e) => tapped.push(e.message)).logCreator(logLevel.ERROR)(entry)).not.toThrow();
    expect(tapped).toEqual(["KafkaJSSASLAuthenticationError: SASL SCRAM-SHA-512 authentication failed"]);
    expect(lines.map((l) => (JSON.parse(l) as { msg: string }).msg)).toEqual([
      "KafkaJSSASLAuthenticationError: SASL SCRAM-SHA-512 authentication failed",
      "KafkaJSSASLAuthenticationError: SASL SCRAM-SHA-512 authentication failed",
    ]);
  });

  it("a component made under a plain child of another keeps the child's bindings, and rebinding a key writes it once", () => {
    const { root, lines } = capturing();
    const console_ = componentLogger(root, "console", { port: 1 });
    const client = componentLogger(console_.child({ request: "r-1" }), "writ-client", { agent: "ops", port: 2 });
    componentLogger(client, "kafkajs", { namespace: "Producer" }).warn("retrying");
    for (const line of lines) expect(duplicatedKeys(line), line).toEqual([]);
    expect(JSON.parse(lines[0]!)).toMatchObject({ component: "kafkajs", namespace: "Producer", agent: "ops", request: "r-1", port: 2 });
  });
});
