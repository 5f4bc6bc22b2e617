// What `writ console` shows, kept in memory and bounded: the records the feed
// reads from writ's topics go in here, decoded; the server sends snapshots of
// it (whole on connect, then the sections that changed). No Kafka, no HTTP:
// a plain object, so its rules can be tested without a broker.
import type { DeadLetter } from "../schemas/dead-letter.ts";
import type { Escalation } from "../schemas/escalation.ts";
import type { Reply } from "../schemas/reply.ts";
import type { Resolution } from "../schemas/resolution.ts";
import type { WriteIntent } from "../schemas/write-intent.ts";

/** Where a record was read. */
export interface RecordRef {
  topic: string;
  partition: number;
  offset: string;
}

export interface ConsoleLimits {
  /** Items kept per recent list (replies, conflicts, dead letters) and shown of the intents in flight. */
  recent: number;
  /** Intents in flight tracked at most (the oldest are dropped, and counted). */
  inFlight: number;
  /** Escalations kept at most (resolved ones are dropped first; then new open ones are not kept, and counted). */
  escalations: number;
  /** Characters of JSON kept per record state, change or params (longer ones are cut, and say so). */
  valueChars: number;
}

export const DEFAULT_LIMITS: ConsoleLimits = { recent: 100, inFlight: 2000, escalations: 500, valueChars: 4000 };

/** JSON text, cut at `valueChars`. */
export interface Clipped {
  json: string;
  truncated: boolean;
}

export interface InFlightItem {
  kind: "intent" | "resolution";
  /** The intent id (a resolution: its resolution id, which its answer is keyed by). */
  intentId: string;
  intentKey: string;
  entity: string;
  tool: string;
  /** The agent (a resolution: the operator). */
  agent: string;
  runId: string | null;
  baseVersion: string | null;
  /** A resolution's decision. */
  decision?: string;
  createdAt: string;
  where: RecordRef;
}

export interface ReplyItem {
  intentId: string;
  intentKey: string;
  status: Reply["status"];
  duplicate: boolean;
  at: string;
  entity: string | null;
  tool: string | null;
  agent: string | null;
  /** True when the agent is the reply topic's suffix, not read from the intent. */
  agentFromTopic: boolean;
  version?: string;
  via?: string;
  cycle?: number;
  reason?: string;
  message?: string;
  escalationId?: string;
  resolvedBy?: string;
  where: RecordRef;
}

export interface ConflictItem {
  intentId: string;
  intentKey: string;
  at: string;
  entity: string;
  tool: string | null;
  agent: string | null;
  cycle: number;
  message: string;
  /** The version the agent wrote from (from its intent, when the console saw it). */
  baseVersion: string | null;
  current: { version: string; state: Clipped };
  yourChange: Clipped;
  where: RecordRef;
}

export interface ResolutionOutcome {
  /** applied, discarded, returned: the escalation is closed; not_open: an owner said it is not open (any more). */
  outcome: "applied" | "discarded" | "returned" | "not_open";
  by: string | null;
  at: string;
  message?: string;
  version?: string;
}

export interface EscalationItem {
  escalationId: string;
  reason: string;
  message: string;
  at: string;
  entity: string;
  tool: string;
  agent: string;
  runId: string;
  intentId: string;
  intentKey: string;
  cycles: number;
  /** The version the agent's intent was made from. */
  baseVersion: string;
  change: Clipped;
  params: Clipped;
  /** The record as the owner last read it, when it could. */
  current: { version: string; state: Clipped } | null;
  /** The escalated write may have reached the system of record already (the escalation says so). */
  mayHaveWritten: boolean;
  status: "open" | "resolved";
  resolution?: ResolutionOutcome;
  /** The last decision sent on it that did not close it (e.g. a resolution_conflict). */
  lastAttempt?: { decision: string; by: string | null; at: string; status: string; reason?: string; message?: string };
  where: RecordRef;
}

export interface DeadLetterItem {
  reason: string;
  message: string;
  at: string;
  key: string | null;
  source: RecordRef;
  originalBytes: number;
  truncated: boolean;
  sha256: string;
  where: RecordRef;
}

export interface LagPartition {
  partition: number;
  /** The owners' committed offset; null when the group has none for the partition. */
  committed: string | null;
  /** High watermark. */
  end: string;
  lastStable: string;
  logStart: string;
  /** end minus committed (minus the log start without a committed offset). */
  lag: number;
}

export interface LagView {
  group: string;
  topic: string;
  at: string;
  partitions: LagPartition[];
  total: number;
  error?: string;
}

export interface Counts {
  applied: number;
  conflict: number;
  rejected: number;
  escalated: number;
  duplicate: number;
  intents: number;
  resolutions: number;
  deadLetters: number;
  escalationsOpen: number;
  escalationsResolved: number;
  /** Open escalations not kept because the list was full of open ones (`writ escalations list` shows them). */
  escalationsDropped: number;
  inFlight: number;
  /** Intents dropped from the in-flight list because it was full. */
  inFlightDropped: number;
  /** Records that did not decode (they are in writ.dlq when they were intents). */
  undecodable: number;
}

export interface ConsoleTopics {
  intents: string;
  human: string;
  dlq: string;
  replyPrefix: string;
  /** The reply topics found so far. */
  replies: string[];
}

export interface ConsoleSnapshot {
  at: string;
  topics: ConsoleTopics;
  counts: Counts;
  inFlight: InFlightItem[];
  replies: ReplyItem[];
  conflicts: ConflictItem[];
  escalations: EscalationItem[];
  deadLetters: DeadLetterItem[];
  lag: LagView | null;
}

export type Section = Exclude<keyof ConsoleSnapshot, "at">;

const entityText = (e: { type: string; id: string } | undefined | null): string | null => (e ? `${e.type}:${e.id}` : null);

/** The console's memory. Every list is bounded; the maps that correlate records are too. */
export class ConsoleState {
  readonly limits: ConsoleLimits;
  private readonly topics: ConsoleTopics;
  private readonly counts: Counts = {
    applied: 0,
    conflict: 0,
    rejected: 0,
    escalated: 0,
    duplicate: 0,
    intents: 0,
    resolutions: 0,
    deadLetters: 0,
    escalationsOpen: 0,
    escalationsResolved: 0,
    escalationsDropped: 0,
    inFlight: 0,
    inFlightDropped: 0,
    undecodable: 0,
  };
  /** Next offset to accept per topic-partition: a record read twice (a reader restarted) counts once. */
  private readonly next = new Map<string, bigint>();
  private readonly inFlight = new Map<string, InFlightItem>();
  /** Intent id → who sent it, for the replies (which name neither agent nor tool). */
  private readonly intentMeta = new Map<string, { agent: string; tool: string; entity: string; baseVersion: string }>();
  /** Intent ids already answered: a reply read before its intent (another reader) keeps it out of flight. */
  private readonly answered = new Map<string, true>();
  /** Resolution id → the escalation it decides, for the operator's answer. */
  private readonly resolutions = new Map<string, { escalationId: string; decision: string; by: string }>();
  /** Escalated intent id → escalation id. */
  private readonly escalationOfIntent = new Map<string, string>();
  /** Closing answers read before their escalation (escalated intent id → outcome). */
  private readonly earlyOutcomes = new Map<string, ResolutionOutcome>();
  private replies: ReplyItem[] = [];
  private conflicts: ConflictItem[] = [];
  private deadLetters: DeadLetterItem[] = [];
  private readonly escalations = new Map<string, EscalationItem>();
  /** The escalations as read, for resolving; only open ones are kept. */
  private readonly openRaw = new Map<string, Escalation>();
  private lag: LagView | null = null;
  /** The owners' committed offset per intents partition: an intent below it has its result committed (settled). */
  private readonly committed = new Map<number, bigint>();
  private readonly dirty = new Set<Section>();

  constructor(topics: Omit<ConsoleTopics, "replies">, limits: Partial<ConsoleLimits> = {}) {
    this.limits = { ...DEFAULT_LIMITS, ...limits };
    this.topics = { ...topics, replies: [] };
  }

  private changed(...sections: Section[]): void {
    for (const s of sections) this.dirty.add(s);
  }

  /** False for a record at or below one already taken from its partition. */
  accept(where: RecordRef): boolean {
    const k = `${where.topic}\u0000${where.partition}`;
    const offset = BigInt(where.offset);
    const next = this.next.get(k);
    if (next !== undefined && offset < next) return false;
    this.next.set(k, offset + 1n);
    return true;
  }

  clip(value: unknown): Clipped {
    let json: string;
    try {
      json = JSON.stringify(value, null, 2) ?? "null";
    } catch {
      json = String(value);
    }
    if (json.length <= this.limits.valueChars) return { json, truncated: false };
    return { json: `${json.slice(0, this.limits.valueChars)}\n… (${json.length - this.limits.valueChars} more characters)`, truncated: true };
  }

  private remember<K, V>(map: Map<K, V>, key: K, value: V, cap: number): void {
    map.delete(key);
    map.set(key, value);
    while (map.size > cap) map.delete(map.keys().next().value as K);
  }

  private get correlationCap(): number {
    return Math.max(5000, this.limits.inFlight * 2);
  }

  /**
   * The reply topics on the cluster now. A deleted one is forgotten with its offsets: the list stays bounded by
   * what exists, and a topic created again under its name (offsets from 0) is not skipped as read already.
   */
  setReplyTopics(topics: string[]): void {
    const listed = new Set(topics);
    const now = [...listed].sort();
    const gone = new Set(this.topics.replies.filter((t) => !listed.has(t)));
    if (gone.size === 0 && now.length === this.topics.replies.length) return;
    for (const k of this.next.keys()) if (gone.has(k.slice(0, k.lastIndexOf("\u0000")))) this.next.delete(k);
    this.topics.replies = now;
    this.changed("topics");
  }

  /** The next offset of a partition not accepted yet (where a restarted reader resumes), if any was. */
  resumeAt(topic: string, partition: number): bigint | undefined {
    return this.next.get(`${topic}\u0000${partition}`);
  }

  undecodable(): void {
    this.counts.undecodable++;
    this.changed("counts");
  }

  intent(where: RecordRef, intent: WriteIntent): void {
    if (!this.accept(where)) return;
    this.counts.intents++;
    const entity = entityText(intent.entity)!;
    this.remember(this.intentMeta, intent.intentId, { agent: intent.agent.id, tool: intent.tool, entity, baseVersion: intent.baseVersion }, this.correlationCap);
    if (!this.answered.has(intent.intentId)) {
      this.track({
        kind: "intent",
        intentId: intent.intentId,
        intentKey: intent.intentKey,
        entity,
        tool: intent.tool,
        agent: intent.agent.id,
        runId: intent.agent.runId,
        baseVersion: intent.baseVersion,
        createdAt: intent.createdAt,
        where,
      });
    }
    this.changed("counts");
  }

  resolution(where: RecordRef, r: Resolution): void {
    if (!this.accept(where)) return;
    this.counts.resolutions++;
    const entity = entityText(r.entity)!;
    this.remember(this.resolutions, r.resolutionId, { escalationId: r.escalationId, decision: r.decision, by: r.operator.id }, this.correlationCap);
    this.remember(this.intentMeta, r.resolutionId, { agent: r.operator.id, tool: r.intent.tool, entity, baseVersion: r.baseVersion ?? "" }, this.correlationCap);
    if (!this.answered.has(r.resolutionId)) {
      this.track({
        kind: "resolution",
        intentId: r.resolutionId,
        intentKey: r.intent.intentKey,
        entity,
        tool: r.intent.tool,
        agent: r.operator.id,
        runId: null,
        baseVersion: r.baseVersion ?? null,
        decision: r.decision,
        createdAt: r.createdAt,
        where,
      });
    }
    this.changed("counts");
  }

  private settled(where: RecordRef): boolean {
    const c = where.topic === this.topics.intents ? this.committed.get(where.partition) : undefined;
    return c !== undefined && BigInt(where.offset) < c;
  }

  private track(item: InFlightItem): void {
    // An intent forwarded to its key's partition is read twice (two offsets): one entry.
    if (this.inFlight.has(item.intentId) || this.settled(item.where)) return;
    this.inFlight.set(item.intentId, item);
    while (this.inFlight.size > this.limits.inFlight) {
      this.inFlight.delete(this.inFlight.keys().next().value as string);
      this.counts.inFlightDropped++;
    }
    this.changed("inFlight", "counts");
  }

  reply(where: RecordRef, reply: Reply): void {
    if (!this.accept(where)) return;
    this.remember(this.answered, reply.intentId, true, this.correlationCap);
    if (this.inFlight.delete(reply.intentId)) {
      this.dirty.add("inFlight");
    }
    const meta = this.intentMeta.get(reply.intentId);
    const fromTopic = where.topic.startsWith(this.topics.replyPrefix) ? where.topic.slice(this.topics.replyPrefix.length) : null;
    const r = reply as Reply & Record<string, unknown>;
    const entity = reply.status === "rejected" ? null : entityText(reply.entity);
    const item: ReplyItem = {
      intentId: reply.intentId,
      intentKey: reply.intentKey,
      status: reply.status,
      duplicate: reply.duplicate,
      at: reply.at,
      entity: entity ?? meta?.entity ?? null,
      tool: meta?.tool ?? null,
      agent: meta?.agent ?? fromTopic,
      agentFromTopic: meta === undefined && fromTopic !== null,
      where,
    };
    if (typeof r.resolvedBy === "string") item.resolvedBy = r.resolvedBy;
    switch (reply.status) {
      case "applied":
        item.version = reply.version;
        item.via = reply.via;
        break;
      case "conflict":
        item.cycle = reply.cycle;
        item.message = reply.message;
        item.version = reply.current.version;
        break;
      case "rejected":
        item.reason = reply.reason;
        item.message = reply.message;
        break;
      case "escalated":
        item.reason = reply.reason;
        item.message = reply.message;
        item.escalationId = reply.escalationId;
        break;
    }
    this.counts[reply.status]++;
    if (reply.duplicate) this.counts.duplicate++;
    this.replies = [item, ...this.replies].slice(0, this.limits.recent);
    const sections: Section[] = ["replies", "counts"];
    if (reply.status === "conflict") {
      const conflict: ConflictItem = {
        intentId: reply.intentId,
        intentKey: reply.intentKey,
        at: reply.at,
        entity: entityText(reply.entity)!,
        tool: item.tool,
        agent: item.agent,
        cycle: reply.cycle,
        message: reply.message,
        baseVersion: meta?.baseVersion ?? null,
        current: { version: reply.current.version, state: this.clip(reply.current.state) },
        yourChange: this.clip(reply.your_change),
        where,
      };
      this.conflicts = [conflict, ...this.conflicts].slice(0, this.limits.recent);
      sections.push("conflicts");
    }
    if (this.noteOutcome(reply)) sections.push("escalations");
    this.changed(...sections);
  }

  /** A reply that closes or answers an escalation: the agent's (escalated intent id) or the operator's (resolution id). */
  private noteOutcome(reply: Reply): boolean {
    const r = reply as Reply & { resolvedBy?: unknown };
    const by = typeof r.resolvedBy === "string" ? r.resolvedBy : null;
    const closing = closingOutcome(reply, by);
    const resolution = this.resolutions.get(reply.intentId);
    if (resolution) {
      const item = this.escalations.get(resolution.escalationId);
      if (closing) return item ? this.close(item, closing) : false;
      if (!item) return false;
      if (reply.status === "rejected" && reply.reason === "resolution_not_applicable" && item.status === "open") {
        return this.close(item, { outcome: "not_open", by: resolution.by, at: reply.at, message: reply.message });
      }
      const detail = reply as { reason?: unknown; message?: unknown };
      item.lastAttempt = {
        decision: resolution.decision,
        by: resolution.by,
        at: reply.at,
        status: reply.status,
        ...(typeof detail.reason === "string" ? { reason: detail.reason } : {}),
        ...(typeof detail.message === "string" ? { message: detail.message } : {}),
      };
      return true;
    }
    if (!closing) return false;
    const escalationId = this.escalationOfIntent.get(reply.intentId);
    const item = escalationId === undefined ? undefined : this.escalations.get(escalationId);
    if (item) return this.close(item, closing);
    this.remember(this.earlyOutcomes, reply.intentId, closing, this.correlationCap);
    return false;
  }

  private close(item: EscalationItem, outcome: ResolutionOutcome): boolean {
    if (item.status === "resolved" && item.resolution?.outcome !== "not_open") return false;
    if (item.status === "open") {
      this.counts.escalationsOpen--;
      this.counts.escalationsResolved++;
    }
    item.status = "resolved";
    item.resolution = outcome;
    this.openRaw.delete(item.escalationId);
    this.dirty.add("counts");
    return true;
  }

  escalation(where: RecordRef, e: Escalation): void {
    if (!this.accept(where)) return;
    if (this.escalations.has(e.escalationId)) return;
    const item: EscalationItem = {
      escalationId: e.escalationId,
      reason: e.reason,
      message: e.message,
      at: e.at,
      entity: entityText(e.intent.entity)!,
      tool: e.intent.tool,
      agent: e.intent.agent.id,
      runId: e.intent.agent.runId,
      intentId: e.intent.intentId,
      intentKey: e.intent.intentKey,
      cycles: e.cycles,
      baseVersion: e.intent.baseVersion,
      change: this.clip(e.intent.delta),
      params: this.clip(e.intent.params),
      current: e.current ? { version: e.current.version, state: this.clip(e.current.state) } : null,
      mayHaveWritten: e.mayHaveWritten === true || e.reason === "outcome_unknown",
      status: "open",
      where,
    };
    this.escalations.set(e.escalationId, item);
    this.escalationOfIntent.set(e.intent.intentId, e.escalationId);
    this.openRaw.set(e.escalationId, e);
    this.counts.escalationsOpen++;
    const early = this.earlyOutcomes.get(e.intent.intentId);
    if (early) {
      this.earlyOutcomes.delete(e.intent.intentId);
      this.close(item, early);
    }
    this.evictEscalations();
    this.changed("escalations", "counts");
  }

  /**
   * Past the limit the oldest resolved escalation goes. When every one kept is open, the newest (just read) is
   * not kept, and counted: an open one the operator may be deciding on the page never vanishes under them (its
   * resolve would 404), and the page says how many more wait.
   */
  private evictEscalations(): void {
    while (this.escalations.size > this.limits.escalations) {
      let victim: EscalationItem | undefined;
      for (const item of this.escalations.values()) {
        if (item.status === "resolved") {
          victim = item;
          break;
        }
      }
      if (victim === undefined) {
        victim = [...this.escalations.values()].at(-1)!;
        this.counts.escalationsDropped++;
      }
      this.escalations.delete(victim.escalationId);
      this.escalationOfIntent.delete(victim.intentId);
      this.openRaw.delete(victim.escalationId);
      if (victim.status === "open") this.counts.escalationsOpen--;
      else this.counts.escalationsResolved--;
    }
  }

  deadLetter(where: RecordRef, d: DeadLetter): void {
    if (!this.accept(where)) return;
    const item: DeadLetterItem = {
      reason: d.reason,
      message: d.message,
      at: d.at,
      key: d.key,
      source: { topic: d.source.topic, partition: d.source.partition, offset: d.source.offset },
      originalBytes: d.originalBytes,
      truncated: d.truncated,
      sha256: d.sha256,
      where,
    };
    this.counts.deadLetters++;
    this.deadLetters = [item, ...this.deadLetters].slice(0, this.limits.recent);
    this.changed("deadLetters", "counts");
  }

  /**
   * The owners' lag. Their committed offsets also settle intents in flight: an
   * owner commits an intent's offset in the transaction that carries its
   * result, so one below it was answered, dead-lettered or forwarded, whether
   * or not this console read a reply.
   */
  setLag(lag: LagView): void {
    this.lag = lag;
    const sections: Section[] = ["lag"];
    if (lag.topic === this.topics.intents) {
      for (const p of lag.partitions) if (p.committed !== null) this.committed.set(p.partition, BigInt(p.committed));
      let pruned = false;
      for (const [id, item] of this.inFlight) {
        if (this.settled(item.where)) {
          this.inFlight.delete(id);
          pruned = true;
        }
      }
      if (pruned) {
        sections.push("inFlight", "counts");
      }
    }
    this.changed(...sections);
  }

  /** An open escalation as read from writ.human (what a resolution needs); undefined when unknown or closed. */
  openEscalation(escalationId: string): Escalation | undefined {
    return this.openRaw.get(escalationId);
  }

  escalationItem(escalationId: string): EscalationItem | undefined {
    return this.escalations.get(escalationId);
  }

  /** The answer an owner gave to a resolution sent from this console (the feed may read it later, or not at all). */
  resolutionAnswered(escalationId: string, decision: string, by: string, answer: { status: string; reason?: string; message?: string; at?: string; version?: string }): void {
    const item = this.escalations.get(escalationId);
    if (!item) return;
    const at = answer.at ?? new Date().toISOString();
    const closing = closingOutcome(answer as Reply, by);
    if (closing) this.close(item, closing);
    else if (answer.status === "rejected" && answer.reason === "resolution_not_applicable") this.close(item, { outcome: "not_open", by, at, ...(answer.message ? { message: answer.message } : {}) });
    else item.lastAttempt = { decision, by, at, status: answer.status, ...(answer.reason ? { reason: answer.reason } : {}), ...(answer.message ? { message: answer.message } : {}) };
    this.changed("escalations", "counts");
  }

  /** Everything, for a new stream (it does not consume the changes the open streams are still to get). */
  snapshot(): ConsoleSnapshot {
    return {
      at: new Date().toISOString(),
      topics: this.section("topics"),
      counts: this.section("counts"),
      inFlight: this.section("inFlight"),
      replies: this.section("replies"),
      conflicts: this.section("conflicts"),
      escalations: this.section("escalations"),
      deadLetters: this.section("deadLetters"),
      lag: this.section("lag"),
    };
  }

  /** The sections changed since the last snapshot or changes, or null when none did. */
  changes(): (Partial<ConsoleSnapshot> & { at: string }) | null {
    if (this.dirty.size === 0) return null;
    const out: Partial<ConsoleSnapshot> & { at: string } = { at: new Date().toISOString() };
    for (const s of this.dirty) (out as Record<string, unknown>)[s] = this.section(s);
    this.dirty.clear();
    return out;
  }

  private section<S extends Section>(s: S): ConsoleSnapshot[S] {
    switch (s) {
      case "topics":
        return { ...this.topics, replies: [...this.topics.replies] } as ConsoleSnapshot[S];
      case "counts":
        return { ...this.counts, inFlight: this.inFlight.size } as ConsoleSnapshot[S];
      case "inFlight":
        // newest first, as many as a recent list
        return [...this.inFlight.values()].slice(-this.limits.recent).reverse() as ConsoleSnapshot[S];
      case "replies":
        return this.replies as ConsoleSnapshot[S];
      case "conflicts":
        return this.conflicts as ConsoleSnapshot[S];
      case "escalations": {
        // open first (oldest first: the longest waiting), then resolved (newest first)
        const all = [...this.escalations.values()];
        const open = all.filter((e) => e.status === "open");
        const resolved = all.filter((e) => e.status === "resolved").reverse();
        return [...open, ...resolved].map((e) => ({ ...e })) as ConsoleSnapshot[S];
      }
      case "deadLetters":
        return this.deadLetters as ConsoleSnapshot[S];
      case "lag":
        return this.lag as ConsoleSnapshot[S];
      default:
        throw new Error(`unknown section ${String(s)}`);
    }
  }
}

/** The outcome of a reply that closes an escalation (carries `resolvedBy`), else null. */
function closingOutcome(reply: { status: string; reason?: string; message?: string; at?: string; version?: string }, by: string | null): ResolutionOutcome | null {
  const at = reply.at ?? new Date().toISOString();
  if (by === null) return null;
  if (reply.status === "applied") return { outcome: "applied", by, at, ...(reply.version ? { version: reply.version } : {}) };
  if (reply.status === "rejected" && reply.reason === "escalation_discarded") return { outcome: "discarded", by, at, ...(reply.message ? { message: reply.message } : {}) };
  if (reply.status === "rejected" && reply.reason === "returned_by_operator") return { outcome: "returned", by, at, ...(reply.message ? { message: reply.message } : {}) };
  return null;
}
