import type { EntityRef, Versioned } from "../schemas/common.ts";
import type { ReadOptions } from "./adapter.ts";
import { createHttpSystemOfRecord, type HttpSystemOfRecordOptions } from "./http-adapter.ts";

/**
 * What the agent side may do with a system of record: read a record and its
 * version. It has no write method, and it is built from read-only
 * configuration (a read-only credential), never from the owners' adapters:
 * single writer is a type, not a convention. The `readOnly` brand keeps a
 * full SystemOfRecord from being passed where a reader is asked for.
 */
export interface RecordReader {
  readonly readOnly: true;
  /** The system's name, as tools refer to it. */
  readonly name: string;
  /** The record and its version; null when it does not exist. Throws as SystemOfRecord.read does. */
  read(entity: EntityRef, opts?: Partial<ReadOptions>): Promise<Versioned | null>;
}

/** The options of {@link createHttpRecordReader}: an HTTP system of record's, without anything that writes. */
export type HttpRecordReaderOptions = Omit<
  HttpSystemOfRecordOptions,
  "patchPath" | "method" | "patchBody" | "ifMatch" | "conflictStatuses" | "idempotencyKeys" | "idempotencyLookupPath"
>;

/**
 * A read-only view of an HTTP system of record for agents' read tools, the
 * MCP server and the framework adapters. Give it read-only credentials
 * (`headers`).
 *
 * @example
 * const crm = createHttpRecordReader({ name: "crm", baseUrl: "https://crm.example.com/api",
 *   headers: () => ({ authorization: `Bearer ${readOnlyToken()}` }) });
 * const ticket = await crm.read({ type: "ticket", id: "T-1" });
 */
export function createHttpRecordReader(opts: HttpRecordReaderOptions): RecordReader {
  const system = createHttpSystemOfRecord(opts as HttpSystemOfRecordOptions);
  const readTimeoutMs = system.config.readTimeoutMs;
  return Object.freeze({
    readOnly: true as const,
    name: system.name,
    read: (entity: EntityRef, o: Partial<ReadOptions> = {}) => system.read(entity, { timeoutMs: o.timeoutMs ?? readTimeoutMs, ...(o.headers ? { headers: o.headers } : {}) }),
  });
}
