import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { SchemaIdLookup } from "../codec.ts";
import { withDeadline } from "../deadline.ts";
import type { AdmittedIntent } from "../owner/admission.ts";
import type { SizeOutcome, SizeTopicKind } from "../owner/records.ts";
import { sorResponseBudget } from "../sor/response-budget.ts";
import type { SorMethod } from "../tracing/spans.ts";
import type { IntentOutcome } from "./outcome.ts";
import type { SorCallObserver } from "./observed-system.ts";

/** What a partition owner reports about itself at scrape time (see `PartitionOwner.stats`). */
export interface PartitionFigures {
  partition: number;
  /** Committed ledger entries of the partition. */
  ledgerEntries: number;
  /** Committed ledger entries still `pending` (a write in flight, or one an earlier owner left). */
  pending: number;
  /** When the oldest of them was recorded (ms since the epoch); null with none. */
  oldestPendingSince: number | null;
  /** Committed ledger entries of escalations still open (awaiting a person's decision: never expired until it comes). */
  escalations: number;
  /** When the oldest of them was escalated (ms since the epoch); null with none. */
  oldestEscalationSince: number | null;
  /** Leases of changes that span records held on the partition's records (expired ones not yet released included). */
  leases: number;
  /** The next offset of the intents partition the owner's transactions committed for the group. */
  committedOffset: bigint;
}

/** Where the gauges come from, asked at every scrape. */
export interface MetricsSource {
  /** The partitions this process owns and runs, now. */
  partitions(): PartitionFigures[];
  /** The intents partitions' high watermarks, asked of the brokers at scrape time; a failure falls back to the last fetched batch's. */
  highWatermarks?(partitions: readonly number[]): Promise<ReadonlyMap<number, bigint>>;
}

/** Why a conflict was met: a 412 from the system of record, or (strict tools) a fresh read at another version than the intent's base. */
export type ConflictCause = "precondition_failed" | "version_mismatch";

const SOR_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
const TXN_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
const RESTORE_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

/**
 * The metrics of one router (owner process), in a registry of its own (not
 * prom-client's global one: several routers in one process do not collide).
 * Served as Prometheus text on `/metrics` beside `/healthz` and `/readyz`, and
 * by `router.metrics()`.
 *
 * Counters are counted when the transaction carrying an intent's result
 * commits (what reached the topics, once, even when a failed transaction
 * makes the owner process an intent again); conflicts when they are met;
 * gauges are read from the owners at scrape time. No label carries a record
 * id.
 */
export class RouterMetrics {
  readonly registry = new Registry();
  private source: MetricsSource | null = null;
  /** High watermarks of intents partitions, as the last fetched batch of each reported them. */
  private readonly fetchedHighWatermarks = new Map<number, bigint>();

  private readonly intents = new Counter({
    name: "writ_intents_total",
    help: "Intents settled, by tool and outcome (applied, conflict, rejected, escalated, dead_lettered, repeat, redelivered), counted when their result committed. redelivered: the same submission delivered again after its result committed (two members fetched the same batch in a rebalance, kafkajs #1197), answered from the ledger.",
    labelNames: ["tool", "outcome"] as const,
    registers: [this.registry],
  });
  private readonly duplicates = new Counter({
    name: "writ_duplicates_answered_total",
    help: "Repeats of an intent key the agents sent again, answered from the ledger (duplicate: true), by tool; redeliveries of the same submission are not counted here.",
    labelNames: ["tool"] as const,
    registers: [this.registry],
  });
  private readonly conflicts = new Counter({
    name: "writ_conflicts_total",
    help: "Conflicts met: a 412 to If-Match (cause precondition_failed) or, for strict tools, a fresh read at another version than the intent's base (version_mismatch), by tool and record type.",
    labelNames: ["tool", "record_type", "cause"] as const,
    registers: [this.registry],
  });
  private readonly escalations = new Counter({
    name: "writ_escalations_total",
    help: "Escalations written to writ.human, by reason.",
    labelNames: ["reason"] as const,
    registers: [this.registry],
  });
  private readonly deadLetters = new Counter({
    name: "writ_dead_letters_total",
    help: "Dead letters written to writ.dlq, by reason.",
    labelNames: ["reason"] as const,
    registers: [this.registry],
  });
  private readonly sorDuration = new Histogram({
    name: "writ_sor_request_duration_seconds",
    help: "Duration of system-of-record calls, by system, method (read, patch, lookup, upsert) and outcome.",
    labelNames: ["system", "method", "outcome"] as const,
    buckets: SOR_BUCKETS,
    registers: [this.registry],
  });
  private readonly forwarded = new Counter({
    name: "writ_forwarded_total",
    help: "Intents that arrived on another partition than their key's (a producer with another partitioner) and were forwarded to it, by the partition they were forwarded to. Counted when forwarded (a failed transaction may count one twice).",
    labelNames: ["partition"] as const,
    registers: [this.registry],
  });
  private readonly leasesExpired = new Counter({
    name: "writ_leases_expired_total",
    help: "Leases of changes that span records which expired before their change released them, by record type (other: a type no admitted tool writes): each points at a stalled or crashed agent. Counted when released (a failed transaction may count one twice).",
    labelNames: ["record_type"] as const,
    registers: [this.registry],
  });
  private readonly leasesRefused = new Counter({
    name: "writ_leases_refused_total",
    help: "Lease acquires refused by a bound, by reason: lease_limit (the agent holds WRIT_MAX_LEASES_PER_AGENT leases on the partition's records), lease_hold_exceeded (a renewal past WRIT_LEASE_MAX_HOLD_MS from the grant), lease_cooldown (a new grant to an agent within the cool-down after its lease of the record ended, its hold past it or to be past it within the grant's time to live). A steady rise is an agent hoarding records, or changes slower than the bounds allow. Counted when decided (a failed transaction may count one twice).",
    labelNames: ["reason"] as const,
    registers: [this.registry],
  });
  private readonly refusalsRemembered = new Counter({
    name: "writ_refusals_remembered_total",
    help: "Refusals of signed intents remembered for their bytes (a ledger entry each, kept a retention), by reason: a steady rise of tool_not_allowed is an agent sending what it may not; of leased, writers waiting out leases.",
    labelNames: ["reason"] as const,
    registers: [this.registry],
  });
  private readonly sizeRefused = new Counter({
    name: "writ_records_refused_size_total",
    help: "Records too large for the topic they were meant for, by topic kind (reply, escalation, dead_letter, forward, ledger; unnamed: a refused request of several records) and outcome: truncated (written without the record's state, or a dead letter trimmed), undeliverable (a reply or escalation not written, the intent dead-lettered), too_large (a forward dead-lettered), dropped (a dead letter the dead-letter topic cannot take even trimmed), refused (the broker refused it, MESSAGE_TOO_LARGE: a failed transaction, the topic's limit learned). Counted when decided (a failed transaction may count one twice).",
    labelNames: ["topic_kind", "outcome"] as const,
    registers: [this.registry],
  });
  private readonly registryLookups = new Counter({
    name: "writ_registry_id_lookups_total",
    help: "Schema registry lookups of schema ids this process had not seen (framed values carry any int32 a producer chose), by outcome: known, unknown (not registered: the record is dead-lettered) or failed (the registry did not answer; asked again after a pause).",
    labelNames: ["outcome"] as const,
    registers: [this.registry],
  });
  private readonly registryLookupWait = new Counter({
    name: "writ_registry_id_lookup_wait_seconds_total",
    help: "Time lookups of unseen schema ids waited for the lookup budget (WRIT_REGISTRY_LOOKUPS_PER_S): rising, someone is framing values with many ids the registry may not know.",
    registers: [this.registry],
  });
  private readonly txnDuration = new Histogram({
    name: "writ_transaction_duration_seconds",
    help: "Duration of the owner transactions that carry results (sends, offsets, commit), by intents partition.",
    labelNames: ["partition"] as const,
    buckets: TXN_BUCKETS,
    registers: [this.registry],
  });
  private readonly restoreDuration = new Histogram({
    name: "writ_restore_duration_seconds",
    help: "Time to take up an intents partition (fence, marker, ledger restore, heal) until it runs, by partition.",
    labelNames: ["partition"] as const,
    buckets: RESTORE_BUCKETS,
    registers: [this.registry],
  });

  constructor() {
    const metrics = this;
    // Gauges of one figure per owned partition, read from the owners at scrape time.
    const perPartition = (name: string, help: string, figure: (f: PartitionFigures, now: number) => number): void => {
      new Gauge({
        name,
        help,
        labelNames: ["partition"] as const,
        registers: [this.registry],
        collect() {
          this.reset();
          const now = Date.now();
          for (const f of metrics.figures()) this.set({ partition: String(f.partition) }, figure(f, now));
        },
      });
    };
    perPartition("writ_ledger_entries", "Committed ledger entries held by this owner, by intents partition.", (f) => f.ledgerEntries);
    perPartition(
      "writ_ledger_pending_entries",
      "Committed ledger entries still pending (a write in flight, or one left by an earlier owner), by intents partition.",
      (f) => f.pending,
    );
    perPartition(
      "writ_ledger_escalated_entries",
      "Committed ledger entries of escalations still open (awaiting a person's decision; kept past the ledger's retention until it comes), by intents partition.",
      (f) => f.escalations,
    );
    perPartition(
      "writ_ledger_oldest_escalated_age_seconds",
      "Age of the oldest open escalation (0 with none), by intents partition.",
      (f, now) => (f.oldestEscalationSince === null ? 0 : Math.max(0, now - f.oldestEscalationSince) / 1000),
    );
    perPartition(
      "writ_leases_held",
      "Leases of changes that span records held on this owner's records (expired ones not yet released included), by intents partition.",
      (f) => f.leases,
    );
    perPartition(
      "writ_ledger_oldest_pending_age_seconds",
      "Age of the oldest pending ledger entry (0 with none), by intents partition.",
      (f, now) => (f.oldestPendingSince === null ? 0 : Math.max(0, now - f.oldestPendingSince) / 1000),
    );
    new Gauge({
      name: "writ_consumer_lag_records",
      help: "Intents not yet committed by the owner: the partition's high watermark minus the offset its transactions committed, by intents partition.",
      labelNames: ["partition"] as const,
      registers: [this.registry],
      async collect() {
        this.reset();
        const figures = metrics.figures();
        const probed = await metrics.highWatermarks(figures.map((f) => f.partition));
        for (const f of figures) {
          const high = [probed.get(f.partition), metrics.fetchedHighWatermarks.get(f.partition)].reduce<bigint>((m, v) => (v !== undefined && v > m ? v : m), -1n);
          if (high < 0n) continue;
          const lag = high - f.committedOffset;
          this.set({ partition: String(f.partition) }, Number(lag > 0n ? lag : 0n));
        }
      },
    });
    // The process's answer budget (src/sor/response-budget.ts), shared by every system of record in the process.
    const budget = sorResponseBudget;
    const budgetGauges: [name: string, help: string, value: () => number][] = [
      ["writ_sor_response_bytes_held", "Bytes of systems-of-record answers this process holds now (bodies being read or parsed, and for each running intent the largest answer it read, whose record it keeps until its run ends), of WRIT_SOR_RESPONSE_BYTES_IN_FLIGHT.", () => budget.held],
      ["writ_sor_response_bytes_held_max", "Most bytes of systems-of-record answers this process held at once since it started: at most WRIT_SOR_RESPONSE_BYTES_IN_FLIGHT plus two answers (2 × maxResponseBytes: what the oldest intent keeps and what it reads).", () => budget.heldMax],
      ["writ_sor_response_bytes_limit", "WRIT_SOR_RESPONSE_BYTES_IN_FLIGHT: bytes of systems-of-record answers this process holds at once before answers wait.", () => budget.limit],
    ];
    for (const [name, help, value] of budgetGauges) {
      new Gauge({
        name,
        help,
        registers: [this.registry],
        collect() {
          this.set(value());
        },
      });
    }
    let waitsSeen = 0;
    new Counter({
      name: "writ_sor_response_budget_waits_total",
      help: "Systems-of-record answers (or parts of them) that waited for the answer budget (WRIT_SOR_RESPONSE_BYTES_IN_FLIGHT): rising, answers are larger or more than the budget holds at once.",
      registers: [this.registry],
      collect() {
        // Counted by the process's budget; each router's registry adds what it has not reported yet.
        if (budget.waits > waitsSeen) this.inc(budget.waits - waitsSeen);
        waitsSeen = budget.waits;
      },
    });
  }

  /** The router's owners, for the gauges. */
  attach(source: MetricsSource): void {
    this.source = source;
  }

  /** A fetched batch of intents partition `partition` reported this high watermark. */
  fetched(partition: number, highWatermark: string): void {
    try {
      const high = BigInt(highWatermark);
      if (high > (this.fetchedHighWatermarks.get(partition) ?? -1n)) this.fetchedHighWatermarks.set(partition, high);
    } catch {
      // Not a number: nothing to learn from it.
    }
  }

  /** The record encoder's hook: a record too large for its topic (see `RecordEncoder`). */
  readonly sizeRefusal = (kind: SizeTopicKind, outcome: SizeOutcome): void => {
    this.sizeRefused.inc({ topic_kind: kind, outcome });
  };

  /** The codec's hook: one lookup of a schema id not seen before. */
  readonly registryLookup = (lookup: SchemaIdLookup): void => {
    this.registryLookups.inc({ outcome: lookup.outcome });
    if (lookup.waitedMs > 0) this.registryLookupWait.inc(lookup.waitedMs / 1000);
  };

  /** Observes system-of-record calls (see `observeSystem`). */
  readonly sorCall: SorCallObserver = (system: string, method: SorMethod, outcome: string, seconds: number) => {
    this.sorDuration.observe({ system, method, outcome }, seconds);
  };

  /** The intent pipeline's hook. */
  readonly pipeline = {
    conflict: (a: AdmittedIntent, cause: ConflictCause) => {
      this.conflicts.inc({ tool: a.tool.name, record_type: a.tool.recordType, cause });
    },
  };

  /** The partition owners' hook (`OwnerContext.observe`). */
  readonly owner = {
    forwarded: (partition: number) => {
      this.forwarded.inc({ partition: String(partition) });
    },
    leaseExpired: (_partition: number, recordType: string) => {
      this.leasesExpired.inc({ record_type: recordType });
    },
    leaseRefused: (_partition: number, reason: "lease_limit" | "lease_hold_exceeded" | "lease_cooldown") => {
      this.leasesRefused.inc({ reason });
    },
    refusalRemembered: (_partition: number, reason: string) => {
      // Reasons are the owner's own (REMEMBERED_REFUSALS): a bounded label.
      this.refusalsRemembered.inc({ reason });
    },
    opened: (partition: number, ms: number) => {
      this.restoreDuration.observe({ partition: String(partition) }, ms / 1000);
    },
    committed: (partition: number, ms: number, outcomes: readonly IntentOutcome[]) => {
      this.txnDuration.observe({ partition: String(partition) }, ms / 1000);
      for (const o of outcomes) {
        this.intents.inc({ tool: o.tool, outcome: o.outcome });
        if (o.outcome === "repeat") this.duplicates.inc({ tool: o.tool });
        for (const reason of o.escalations) this.escalations.inc({ reason });
        for (const reason of o.deadLetters) this.deadLetters.inc({ reason });
      }
    },
  };

  /** Prometheus text format. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  private figures(): PartitionFigures[] {
    try {
      return this.source?.partitions() ?? [];
    } catch {
      return [];
    }
  }

  private async highWatermarks(partitions: readonly number[]): Promise<ReadonlyMap<number, bigint>> {
    const ask = this.source?.highWatermarks;
    if (!ask || partitions.length === 0) return new Map();
    return withDeadline(ask.call(this.source, partitions).catch(() => new Map<number, bigint>()), 2000, () => new Map<number, bigint>());
  }
}
