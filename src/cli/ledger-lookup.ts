// The latest ledger entries of some intent keys, read from the ledger topic (compacted, keyed by intent key) from
// its beginning to the end it has now: for `writ undo <key>` (the undone write's record and tool) and
// `writ escalations list --open` (whether each case is still open). The whole topic is read: slow on a large ledger.
import type { Kafka } from "kafkajs";
import type { WireCodec } from "../codec.ts";
import type { Logger } from "../logger.ts";
import type { LedgerIntentEntry } from "../schemas/ledger-entry.ts";
import { decodeRecord } from "./tail.ts";
import { readWholeTopic } from "./topic-reader.ts";

/**
 * Each key's latest intent entry, by key: null when the key is not in `topic` or its last record is a tombstone.
 * An entry that does not decode is reported and passed over. `unfinished`: the partitions not read to their end
 * (nothing arrived for a while), whose answers may be stale.
 */
export async function latestLedgerEntries(
  kafka: Kafka,
  codec: WireCodec,
  topic: string,
  keys: ReadonlySet<string>,
  log: Logger,
): Promise<{ entries: Map<string, LedgerIntentEntry | null>; unfinished: string[] }> {
  const found = new Map<string, LedgerIntentEntry | null>([...keys].map((k) => [k, null]));
  if (keys.size === 0) return { entries: found, unfinished: [] };
  const { unfinished } = await readWholeTopic(kafka, topic, log, async (r) => {
    const key = r.key?.toString("utf8");
    if (key === undefined || !keys.has(key)) return;
    const d = await decodeRecord(codec, "LedgerEntry", r);
    if (d.tombstone) found.set(key, null);
    else if (d.error !== undefined) log.warn(`the ledger entry of ${key.slice(0, 12)}… at ${d.partition}@${d.offset} cannot be read: ${d.error}`);
    else if ((d.value as { kind?: unknown }).kind === "intent") found.set(key, d.value as LedgerIntentEntry);
  });
  return { entries: found, unfinished };
}
