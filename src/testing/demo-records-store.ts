import type { DatabaseSync, StatementSync } from "node:sqlite";

/**
 * `node:sqlite` is loaded when a store opens, not when this module is imported, so that `writ/testing`
 * (the local stack) imports on a Node without it; the demo records server itself needs Node >= 22.13.
 */
function sqlite(): typeof import("node:sqlite") {
  // undefined (or no getBuiltinModule at all) where the module is missing or still behind a flag
  const mod = process.getBuiltinModule?.("node:sqlite") as typeof import("node:sqlite") | undefined;
  if (mod === undefined) throw new Error(`the demo records server needs node:sqlite (Node >= 22.13); this is Node ${process.versions.node}`);
  return mod;
}

/**
 * The demo records server's storage, on `node:sqlite`. Everything a test may
 * want to count lives here, not in the client under test: committed writes
 * (`history`), the responses stored per Idempotency-Key, and every PATCH that
 * reached the server (`patch_requests`).
 *
 * Tables:
 * - `records(type, id, state JSON, version INTEGER)`
 * - `history(seq, type, id, kind, from_version, to_version, ops JSON, state JSON, idempotency_key, at)`:
 *   one row per committed write; `from_version` is 0 for a create.
 * - `idempotency_keys(key, type, id, version, status, body JSON, etag, fingerprint, at)`:
 *   the first committed write per key (only successful writes are stored).
 * - `patch_requests(seq, idempotency_key, type, id, if_match, outcome, status, fault, owner, at)`: `owner` is
 *   the `x-writ-owner` header (the writ owner instance that sent it), so a test can tell who wrote when.
 * - `put_requests(seq, idempotency_key, type, id, if_match, if_none_match, outcome, status, fault, owner, at)`:
 *   every PUT of a record that reached the server (creates with `If-None-Match: *`, replaces with `If-Match`).
 */

export type WriteKind = "create" | "replace" | "patch";

export interface StoredRecord {
  type: string;
  id: string;
  state: unknown;
  /** Integer version; the ETag is {@link formatEtag}(version). */
  version: number;
}

/** One committed write: the version chain of a record is its list of these. */
export interface HistoryEntry {
  seq: number;
  type: string;
  id: string;
  kind: WriteKind;
  /** 0 when the write created the record. */
  fromVersion: number;
  toVersion: number;
  /** The ETag of `toVersion`, as GET would send it. */
  etag: string;
  /** The JSON Patch, for `kind: "patch"`. */
  ops: unknown[] | null;
  /** The state after the write. */
  state: unknown;
  idempotencyKey: string | null;
  at: string;
}

/** The response stored for an Idempotency-Key, replayed as is. */
export interface StoredResponse {
  key: string;
  type: string;
  id: string;
  version: number;
  status: number;
  body: unknown;
  etag: string;
  /** Serialised request ops; a replay with other ops is refused (Stripe's rule). */
  fingerprint: string;
}

export type PatchRequestOutcome =
  | "applied"
  | "replayed"
  | "precondition_failed"
  | "precondition_required"
  | "storm_412"
  | "not_found"
  | "test_failed"
  | "refused"
  | "invalid_patch"
  | "bad_request"
  | "key_reused"
  | "unsupported_media_type";

export type PutRequestOutcome =
  | "created"
  | "replaced"
  | "replayed"
  | "precondition_failed"
  | "precondition_required"
  | "bad_request"
  | "key_reused"
  | "unsupported_media_type";

/** One PUT of a record that reached the server. */
export interface PutRequestRow {
  seq: number;
  idempotencyKey: string | null;
  type: string;
  id: string;
  ifMatch: string | null;
  ifNoneMatch: string | null;
  outcome: PutRequestOutcome;
  status: number;
  fault: string | null;
  owner: string | null;
  at: string;
}

export interface PatchRequestRow {
  seq: number;
  idempotencyKey: string | null;
  type: string;
  id: string;
  ifMatch: string | null;
  outcome: PatchRequestOutcome;
  status: number;
  /** The injected fault that shaped the answer, if any. */
  fault: string | null;
  /** The `x-writ-owner` request header: which owner process sent the PATCH. */
  owner: string | null;
  at: string;
}

export interface DemoRecordsStats {
  records: number;
  /** Committed writes of every kind (seeds, PUTs, PATCHes). */
  writes: number;
  /** PATCH requests that reached the server, whatever came of them. */
  patchRequests: number;
  patchRequestsByKey: Record<string, number>;
  /** Committed writes per Idempotency-Key: the number that proves "written once". */
  writesByKey: Record<string, number>;
  /** PUT requests that reached the server (creates and replaces), whatever came of them. */
  putRequests: number;
  putRequestsByKey: Record<string, number>;
}

export interface CommitInput {
  type: string;
  id: string;
  kind: WriteKind;
  /** The version the write replaces; 0 for a create. */
  fromVersion: number;
  state: unknown;
  ops?: unknown[];
  /** Recorded on the history row and, for the first commit with this key, as a replayable response. */
  idempotency?: { key: string; fingerprint: string; status: number };
}

/** Strong ETag of a version number (RFC 9110 §8.8.3). */
export function formatEtag(version: number): string {
  return `"v${version}"`;
}

type Row = Record<string, unknown>;

const SCHEMA = `
  CREATE TABLE IF NOT EXISTS records (
    type TEXT NOT NULL, id TEXT NOT NULL, state TEXT NOT NULL, version INTEGER NOT NULL,
    PRIMARY KEY (type, id)
  );
  CREATE TABLE IF NOT EXISTS history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    type TEXT NOT NULL, id TEXT NOT NULL, kind TEXT NOT NULL,
    from_version INTEGER NOT NULL, to_version INTEGER NOT NULL,
    ops TEXT, state TEXT NOT NULL, idempotency_key TEXT, at TEXT NOT NULL
  );
  CREATE INDEX IF NOT EXISTS history_entity ON history (type, id, seq);
  CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY, type TEXT NOT NULL, id TEXT NOT NULL, version INTEGER NOT NULL,
    status INTEGER NOT NULL, body TEXT NOT NULL, etag TEXT NOT NULL, fingerprint TEXT NOT NULL, at TEXT NOT NULL
  );
  CREATE TABLE IF NOT EXISTS patch_requests (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT, type TEXT NOT NULL, id TEXT NOT NULL, if_match TEXT,
    outcome TEXT NOT NULL, status INTEGER NOT NULL, fault TEXT, owner TEXT, at TEXT NOT NULL
  );
  CREATE TABLE IF NOT EXISTS put_requests (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT, type TEXT NOT NULL, id TEXT NOT NULL, if_match TEXT, if_none_match TEXT,
    outcome TEXT NOT NULL, status INTEGER NOT NULL, fault TEXT, owner TEXT, at TEXT NOT NULL
  );
`;

export class DemoRecordsStore {
  readonly #db: DatabaseSync;
  /** Statements prepared once per SQL text: preparing on every request was most of this store's CPU under the bench. */
  readonly #statements = new Map<string, StatementSync>();

  constructor(dbPath: string) {
    this.#db = new (sqlite().DatabaseSync)(dbPath);
    if (dbPath !== ":memory:") this.#db.exec("PRAGMA journal_mode = WAL");
    this.#db.exec(SCHEMA);
  }

  #sql(sql: string): StatementSync {
    let statement = this.#statements.get(sql);
    if (statement === undefined) {
      statement = this.#db.prepare(sql);
      this.#statements.set(sql, statement);
    }
    return statement;
  }

  get(type: string, id: string): StoredRecord | undefined {
    const row = this.#sql("SELECT state, version FROM records WHERE type = ? AND id = ?").get(type, id) as
      | Row
      | undefined;
    if (row === undefined) return undefined;
    return { type, id, state: JSON.parse(String(row.state)), version: Number(row.version) };
  }

  /** Commits one write atomically: record, history row, idempotency key. */
  commit(input: CommitInput): StoredRecord {
    const version = input.fromVersion + 1;
    const state = JSON.stringify(input.state);
    const at = new Date().toISOString();
    const key = input.idempotency?.key ?? null;
    this.#db.exec("BEGIN IMMEDIATE");
    try {
      this.#sql(
        `INSERT INTO records (type, id, state, version) VALUES (?, ?, ?, ?)
         ON CONFLICT (type, id) DO UPDATE SET state = excluded.state, version = excluded.version`
      ).run(input.type, input.id, state, version);
      this.#sql(
        `INSERT INTO history (type, id, kind, from_version, to_version, ops, state, idempotency_key, at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`
      ).run(
        input.type,
        input.id,
        input.kind,
        input.fromVersion,
        version,
        input.ops === undefined ? null : JSON.stringify(input.ops),
        state,
        key,
        at,
      );
      if (input.idempotency !== undefined) {
        // First commit wins: with dedupe switched off a key can commit twice, and lookup must still answer.
        this.#sql(
          `INSERT OR IGNORE INTO idempotency_keys (key, type, id, version, status, body, etag, fingerprint, at)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`
        ).run(
          input.idempotency.key,
          input.type,
          input.id,
          version,
          input.idempotency.status,
          state,
          formatEtag(version),
          input.idempotency.fingerprint,
          at,
        );
      }
      this.#db.exec("COMMIT");
    } catch (err) {
      this.#db.exec("ROLLBACK");
      throw err;
    }
    return { type: input.type, id: input.id, state: input.state, version };
  }

  findIdempotencyKey(key: string): StoredResponse | undefined {
    const row = this.#sql("SELECT * FROM idempotency_keys WHERE key = ?").get(key) as Row | undefined;
    if (row === undefined) return undefined;
    return {
      key,
      type: String(row.type),
      id: String(row.id),
      version: Number(row.version),
      status: Number(row.status),
      body: JSON.parse(String(row.body)),
      etag: String(row.etag),
      fingerprint: String(row.fingerprint),
    };
  }

  recordPatchRequest(row: Omit<PatchRequestRow, "seq" | "at">): void {
    this.#sql(
      `INSERT INTO patch_requests (idempotency_key, type, id, if_match, outcome, status, fault, owner, at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`
    ).run(row.idempotencyKey, row.type, row.id, row.ifMatch, row.outcome, row.status, row.fault, row.owner, new Date().toISOString());
  }

  recordPutRequest(row: Omit<PutRequestRow, "seq" | "at">): void {
    this.#sql(
      `INSERT INTO put_requests (idempotency_key, type, id, if_match, if_none_match, outcome, status, fault, owner, at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
    ).run(row.idempotencyKey, row.type, row.id, row.ifMatch, row.ifNoneMatch, row.outcome, row.status, row.fault, row.owner, new Date().toISOString());
  }

  putRequests(idempotencyKey?: string): PutRequestRow[] {
    const rows = this.#requests("put_requests", idempotencyKey);
    const text = (v: unknown) => (v === null || v === undefined ? null : String(v));
    return rows.map((row) => ({
      seq: Number(row.seq),
      idempotencyKey: text(row.idempotency_key),
      type: String(row.type),
      id: String(row.id),
      ifMatch: text(row.if_match),
      ifNoneMatch: text(row.if_none_match),
      outcome: String(row.outcome) as PutRequestOutcome,
      status: Number(row.status),
      fault: text(row.fault),
      owner: text(row.owner),
      at: String(row.at),
    }));
  }

  history(type: string, id: string): HistoryEntry[] {
    const rows = this.#sql("SELECT * FROM history WHERE type = ? AND id = ? ORDER BY seq").all(type, id) as Row[];
    return rows.map((row) => ({
      seq: Number(row.seq),
      type: String(row.type),
      id: String(row.id),
      kind: String(row.kind) as WriteKind,
      fromVersion: Number(row.from_version),
      toVersion: Number(row.to_version),
      etag: formatEtag(Number(row.to_version)),
      ops: row.ops === null ? null : (JSON.parse(String(row.ops)) as unknown[]),
      state: JSON.parse(String(row.state)),
      idempotencyKey: row.idempotency_key === null ? null : String(row.idempotency_key),
      at: String(row.at),
    }));
  }

  /** Rows of a request log, oldest first, optionally for one Idempotency-Key. */
  #requests(table: "patch_requests" | "put_requests", idempotencyKey: string | undefined): Row[] {
    return (
      idempotencyKey === undefined
        ? this.#sql(`SELECT * FROM ${table} ORDER BY seq`).all()
        : this.#sql(`SELECT * FROM ${table} WHERE idempotency_key = ? ORDER BY seq`).all(idempotencyKey)
    ) as Row[];
  }

  patchRequests(idempotencyKey?: string): PatchRequestRow[] {
    const rows = this.#requests("patch_requests", idempotencyKey);
    return rows.map((row) => ({
      seq: Number(row.seq),
      idempotencyKey: row.idempotency_key === null ? null : String(row.idempotency_key),
      type: String(row.type),
      id: String(row.id),
      ifMatch: row.if_match === null ? null : String(row.if_match),
      outcome: String(row.outcome) as PatchRequestOutcome,
      status: Number(row.status),
      fault: row.fault === null ? null : String(row.fault),
      owner: row.owner === null || row.owner === undefined ? null : String(row.owner),
      at: String(row.at),
    }));
  }

  stats(): DemoRecordsStats {
    const count = (sql: string): number => Number((this.#sql(sql).get() as Row).n);
    const byKey = (sql: string): Record<string, number> => {
      const out: Record<string, number> = {};
      for (const row of this.#sql(sql).all() as Row[]) out[String(row.k)] = Number(row.n);
      return out;
    };
    return {
      records: count("SELECT COUNT(*) AS n FROM records"),
      writes: count("SELECT COUNT(*) AS n FROM history"),
      patchRequests: count("SELECT COUNT(*) AS n FROM patch_requests"),
      patchRequestsByKey: byKey(
        "SELECT idempotency_key AS k, COUNT(*) AS n FROM patch_requests WHERE idempotency_key IS NOT NULL GROUP BY k",
      ),
      writesByKey: byKey(
        "SELECT idempotency_key AS k, COUNT(*) AS n FROM history WHERE idempotency_key IS NOT NULL GROUP BY k",
      ),
      putRequests: count("SELECT COUNT(*) AS n FROM put_requests"),
      putRequestsByKey: byKey(
        "SELECT idempotency_key AS k, COUNT(*) AS n FROM put_requests WHERE idempotency_key IS NOT NULL GROUP BY k",
      ),
    };
  }

  reset(): void {
    this.#db.exec(
      "DELETE FROM records; DELETE FROM history; DELETE FROM idempotency_keys; DELETE FROM patch_requests; DELETE FROM put_requests;",
    );
  }

  close(): void {
    if (this.#db.isOpen) this.#db.close();
  }
}
