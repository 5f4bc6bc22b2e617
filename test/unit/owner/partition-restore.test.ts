// The order of a partition's open (src/owner/partition-restore.ts), with fakes that log each step: the take-up check
// needs no ledger and comes first, so a partition it refuses is neither fenced, nor given a marker, nor read; the
// ledger's check needs the restored progress entry and comes after the restore. At the broker: the single-writer
// integration test.
import { Writable } from "node:stream";
import { AssignerProtocol } from "kafkajs";
import { pino } from "pino";
import { beforeEach, describe, expect, it, vi } from "vitest";
import { WireCodec } from "../../../src/codec.ts";
import { RouterConfig, parseConfig } from "../../../src/config.ts";
import { WritError } from "../../../src/errors.ts";
import type { RestoredEntry } from "../../../src/ledger/ledger-state.ts";
import type { LedgerIntentEntry } from "../../../src/schemas/ledger-entry.ts";
import type { OwnerContext } from "../../../src/owner/owner-context.ts";
import { restorePartition } from "../../../src/owner/partition-restore.ts";
import { RecordEncoder } from "../../../src/owner/records.ts";
import type { OwnerGroupsLook } from "../../../src/owner/single-writer.ts";

/** Each step of the open, in order. */
const steps = vi.hoisted(() => [] as string[]);

vi.mock("../../../src/owner/transactions.ts", async (importOriginal) => ({
  ...(await importOriginal<typeof import("../../../src/owner/transactions.ts")>()),
  ownerProducer: async () => ({
    protocol: "v1" as const,
    connect: async () => void steps.push("fence"),
    disconnect: async () => undefined,
    transaction: async () => ({
      send: async (rounds: { messages: { key: string | null }[] }[]) => {
        for (const round of rounds) for (const m of round.messages) steps.push(m.key?.startsWith("__marker__:") ? "marker" : `write ${m.key}`);
      },
      sendOffset: async () => undefined,
      commit: async () => undefined,
      abort: async () => undefined,
    }),
  }),
}));

const config = parseConfig(RouterConfig, { brokers: ["127.0.0.1:9"], transactionProtocol: "v1" }, "router");
const OTHER = "writ.owners.renamed";

const found = {
  nothing: { owners: [], undetermined: [] },
  rebalancing: { owners: [], undetermined: [{ group: OTHER, state: "PreparingRebalance", members: 1 }] },
  owners: { owners: [{ group: OTHER, members: 1, ledger: config.topics.ledger }], undetermined: [] },
} satisfies Record<string, OwnerGroupsLook>;

/** A progress entry of the ledger partition written by another group, which still consumes the intents topic. */
const otherGroupsProgress: [string, RestoredEntry] = ["__progress__:0", { kind: "progress", partition: 0, offset: "5", at: new Date().toISOString(), group: OTHER }];

/** An owner context whose take-up look finds `look`, whose ledger partition 0 holds `ledger` (nothing by default). */
function context(
  look: OwnerGroupsLook,
  opts: { ledger?: [string, RestoredEntry][]; inDoubt?: [string, LedgerIntentEntry][]; ablateSingleWriter?: true; ablateTakeUp?: true } = {},
): OwnerContext {
  const { ledger = [], inDoubt = [], ...flags } = opts;
  const subscribed = AssignerProtocol.MemberMetadata.encode({ version: 1, topics: [config.topics.intents], userData: Buffer.alloc(0) });
  const codec = new WireCodec({});
  return {
    config,
    codec,
    encoder: new RecordEncoder(codec, config),
    log: pino({ level: "silent" }),
    admission: { config },
    ownerGroups: async () => {
      steps.push("take-up look");
      return look;
    },
    reader: {
      restore: async () => {
        steps.push("restore");
        return { entries: new Map(ledger), lastCommitted: ledger.length - 1 };
      },
    },
    inDoubtReader: { scanInDoubt: async () => new Map(inDoubt) },
    admin: {
      describeGroups: async (ids: string[]) => {
        steps.push("ledger check");
        return { groups: ids.map((groupId) => ({ groupId, state: "Stable", protocolType: "consumer", members: [{ memberMetadata: subscribed, memberAssignment: Buffer.alloc(0) }] })) };
      },
    },
    topicDirectory: {
      partitionCounts: async () => {
        steps.push("heal");
        throw new WritError("kafka_failed", "the test ends the open here", { retriable: true });
      },
    },
    ...flags,
  } as unknown as OwnerContext;
}

const open = (ctx: OwnerContext) => restorePartition(ctx, 0, pino({ level: "silent" }), () => false);

describe("restorePartition: what runs before what", () => {
  beforeEach(() => {
    steps.length = 0;
  });

  it("a partition the take-up check refuses while another group cannot be told (tried again every 30 s) is not fenced, gets no marker in the ledger and is not read", async () => {
    await expect(open(context(found.rebalancing))).rejects.toMatchObject({ code: "ledger_foreign_writer", retriable: true, message: expect.stringContaining(OTHER) });
    expect(steps).toEqual(["take-up look"]);
  });

  it("nor is one whose take-up check finds another group of owners running (this owner stops)", async () => {
    await expect(open(context(found.owners))).rejects.toMatchObject({ code: "config_invalid", retriable: false });
    expect(steps).toEqual(["take-up look"]);
  });

  it("one the take-up check lets through is fenced, marked and restored; the ledger's check, which needs the restored progress entry, comes after the restore and refuses it", async () => {
    await expect(open(context(found.nothing, { ledger: [otherGroupsProgress] }))).rejects.toMatchObject({ code: "ledger_foreign_writer", message: expect.stringContaining(`written by consumer group ${OTHER}`) });
    expect(steps).toEqual(["take-up look", "fence", "marker", "restore", "ledger check"]);
  });

  it("ablateTakeUp skips the take-up look only; ablateSingleWriter skips both checks", async () => {
    await expect(open(context(found.owners, { ledger: [otherGroupsProgress], ablateTakeUp: true }))).rejects.toMatchObject({ code: "ledger_foreign_writer" });
    expect(steps).toEqual(["fence", "marker", "restore", "ledger check"]);
    steps.length = 0;
    await expect(open(context(found.owners, { ledger: [otherGroupsProgress], ablateSingleWriter: true }))).rejects.toThrow("the test ends the open here");
    expect(steps).toEqual(["fence", "marker", "restore", "heal"]);
  });
});

// The in-doubt scan reads aborted records, which any producer with write access to writ.ledger can leave there (a
// transaction it aborts): a `pending` entry under its own key, whose key no schema bounds. The open's warning listed
// up to 20 of those keys whole, at every open of the partition: 20 keys of 256 KiB made a 5 MiB log line.
describe("restorePartition's warning of in-doubt entries", () => {
  it("lists their keys bounded, whatever their length", async () => {
    const at = new Date().toISOString();
    const pending = (key: string): [string, LedgerIntentEntry] => [
      key,
      { kind: "intent", intentKey: key, intentId: "i", status: "pending", entity: { type: "ticket", id: "T-1" }, tool: "add_tag", fingerprint: "f", attempts: [{ baseVersion: '"1"', deltaFingerprint: "d" }], cycles: 0, replyTo: "writ.replies.a", updatedAt: at },
    ];
    const lines: string[] = [];
    const log = pino({ level: "warn" }, new Writable({ write: (chunk: Buffer, _enc, done) => void (lines.push(chunk.toString("utf8")), done()) }));
    const ctx = context(found.nothing, { inDoubt: Array.from({ length: 20 }, (_, i) => pending(`${i}`.padEnd(256 * 1024, "k"))) });
    await expect(restorePartition(ctx, 0, log, () => false)).rejects.toThrow("the test ends the open here");
    const warned = lines.filter((l) => l.includes("taken up as in doubt"));
    expect(warned).toHaveLength(1);
    expect(JSON.parse(warned[0]!)).toMatchObject({ entries: 20 });
    expect(warned[0]!.length).toBeLessThan(4_000);
  });
});
