// What `writ console` shows, kept in memory and bounded: the records the feed
// reads from writ's topics go in here, decoded; the server sends snapshots of
// it (whole on connect, then the sections that changed). No Kafka, no HTTP:
// a plain object, so its rules can be tested without a broker.
//
// Every record read here is hostile: any producer can write writ.human,
// writ.dlq and the reply topics. So every string taken from one is cut to a
// bound as it comes in (a record's megabyte message would otherwise be kept,
// and sent to every page), and nothing read from a reply or a second record
// decides what the operator may do: the owner's ledger does.
import { createHash } from "node:crypto";
import { canonicalJson } from "../canonical-json.ts";
import { entityKey, Version } from "../schemas/common.ts";
import type { DeadLetter } from "../schemas/dead-letter.ts";
import type { Escalation } from "../schemas/escalation.ts";
import type { Reply } from "../schemas/reply.ts";
import type { Resolution } from "../schemas/resolution.ts";
import type { WriteIntent } from "../schemas/write-intent.ts";
import type { AclCheck } from "../doctor/acls.ts";
import { LruMap } from "../lru-map.ts";
import { jsonSafe, printable } from "../printable.ts";

import {
  DEFAULT_LIMITS,
  NAME_CHARS,
  type AnswerShown,
  type Clipped,
  type ConflictItem,
  type ConsoleLimits,
  type ConsoleChanges,
  type ConsoleSnapshot,
  type ConsoleTopics,
  type Counts,
  type DeadLetterChanges,
  type DeadLetterItem,
  type EscalationChanges,
  type EscalationItem,
  type InFlightItem,
  type LagView,
  type NotResolvable,
  type RecordRef,
  type RecordShown,
  type ReplyItem,
  type ResolutionOutcome,
  type Section,
  type SentBackFrom,
  escalationPlace,
} from "./view.ts";

export * from "./view.ts";

/** The first 32 hex digits of the sha256 of `s`: what keeps two ids shown alike two keys. */
// Over the string's UTF-16 code units: as UTF-8, every lone surrogate would be one U+FFFD, and two strings differing
// only in one would share a digest. 128 bits: a name is someone's choice, and must not be made to collide.
const digestOf = (s: string): string => createHash("sha256").update(Buffer.from(s, "utf16le")).digest("hex").slice(0, 32);

/**
 * The beginning of `s` as shown, each character escaped by `escape`, in at most `max` characters: cut only between
 * whole escapes (never inside a `\x1b` or a `\u202e`; in JSON, `json`, never inside one of its own escapes, `\n`,
 * `\"`, `\u0000`), nor inside a surrogate pair. Escaped first and then cut, so the bound is on what is shown (cut
 * first, escaping made it up to 6 times longer). `taken`: how many characters of `s` it shows. Reads no more of `s`
 * than it shows.
 */
function shownPrefix(s: string, max: number, escape: (c: string) => string, json = false): { text: string; taken: number } {
  const parts: string[] = [];
  let length = 0;
  let i = 0;
  while (i < s.length) {
    const c = s.charCodeAt(i);
    // outside strings JSON has no backslash: from the start, each one met begins an escape (\uXXXX, or two characters)
    const n = json && c === 0x5c ? (s.charCodeAt(i + 1) === 0x75 ? 6 : 2) : c >= 0xd800 && c <= 0xdbff && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00 ? 2 : 1;
    const shown = n === 1 ? escape(s[i]!) : s.slice(i, i + n);
    if (length + shown.length > max) break;
    parts.push(shown);
    length += shown.length;
    i += n;
  }
  return { text: parts.join(""), taken: i };
}

/** Claims kept per dead letter not read yet (records naming it in writ-redriven-from). */
const SENT_BACK_CLAIMS = 4;

interface SentBack {
  to: RecordRef;
  key: string | null;
  sha256: string;
}


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
    escalationsMiskeyed: 0,
    cut: 0,
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
  /** Records read that were sent back from a dead letter (`partition:offset` of writ.dlq), for dead letters read after them. */
  private readonly sentBack = new LruMap<string, SentBack[]>(4096);
  private readonly escalations = new Map<string, EscalationItem>();
  /**
   * What resolving an escalation needs of its record (escalation id, intent, record version), as JSON: only
   * that, and only while the page may resolve it.
   */
  private readonly openRaw = new Map<string, string>();
  /** Escalation id → digest of the first record's intent, reason and message (a second record that differs contests it). */
  private readonly fingerprints = new Map<string, string>();
  private lag: LagView | null = null;
  private trustCheck: AclCheck | null = null;
  /** The owners' committed offset per intents partition: an intent below it has its result committed (settled). */
  private readonly committed = new Map<number, bigint>();
  private readonly dirty = new Set<Section>();
  /** Escalation ids changed since the last update: "whole" (new, or the record shown changed) or "status" (see EscalationChanges). */
  private readonly touched = new Map<string, "whole" | "status">();
  /** Items put in front of each recent list since the last update (RecentChanges). */
  private readonly fresh = { replies: 0, conflicts: 0, deadLetters: 0 };
  /** Dead letters (`partition:offset` of writ.dlq) marked sent back since the last update. */
  private readonly markedSentBack = new Set<string>();

  constructor(topics: Omit<ConsoleTopics, "replies">, limits: Partial<ConsoleLimits> = {}) {
    this.limits = { ...DEFAULT_LIMITS, ...limits };
    this.topics = { ...topics, replies: [] };
  }

  private changed(...sections: Section[]): void {
    for (const s of sections) this.dirty.add(s);
  }

  /** An escalation changed: the next update carries it (whole, or its status fields), not the whole list. */
  private touch(item: EscalationItem, how: "whole" | "status"): void {
    if (this.touched.get(item.escalationId) !== "whole") this.touched.set(item.escalationId, how);
    this.dirty.add("escalations");
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

  /**
   * Compact JSON first, cut when too long; indented only when the compact form fits. Indenting first would
   * cost the indented length, and a deeply nested value indents to a hundred times its size (a megabyte of
   * arrays 118 deep: 121 M characters, 0.4 s a value). Values come decoded at most 128 deep (decodeRecord),
   * so indenting one that fits is bounded; the compact form is shown when the indented one would not fit.
   * What JSON.stringify leaves raw and a page would act on (C1 controls, bidi overrides) is written as \u
   * escapes, as jsonLine writes them: the text parses back to the same value (the page prefills a change with it).
   * Escaped before it is measured and cut: a cut one is at most `valueChars` characters of the escaped JSON, from
   * its beginning and never ending inside an escape, then how many characters of the JSON were not shown.
   */
  clip(value: unknown): Clipped {
    const max = this.limits.valueChars;
    let json: string;
    try {
      json = JSON.stringify(value) ?? "null";
    } catch {
      json = printable(String(value));
    }
    // escaped, it is at least as long: one too long already is cut without escaping the whole of it
    const safe = json.length > max ? null : jsonSafe(json);
    if (safe === null || safe.length > max) {
      this.counts.cut++;
      // escaped, then cut on a whole escape: at most `max` characters, a beginning of the escaped JSON
      const { text, taken } = shownPrefix(json, max, jsonSafe, true);
      return { json: `${text}\n… (${json.length - taken} more characters)`, truncated: true };
    }
    let indented: string | undefined;
    try {
      indented = jsonSafe(JSON.stringify(value, null, 2));
    } catch {
      indented = undefined;
    }
    return { json: indented !== undefined && indented.length <= max ? indented : safe, truncated: false };
  }

  /**
   * A message or reason from a record, its controls and bidi overrides shown as escapes (printable): never acted on
   * by the page. At most `textChars` characters as shown, cut on a whole escape; a cut one says how many of its
   * characters were not shown.
   */
  text(s: string): string {
    const max = this.limits.textChars;
    if (s.length <= max) {
      const shown = printable(s);
      if (shown.length <= max) return shown;
    }
    this.counts.cut++;
    const { text, taken } = shownPrefix(s, max, printable);
    return `${text}… (${s.length - taken} more characters)`;
  }

  private textOf(s: unknown): string | undefined {
    return typeof s === "string" ? this.text(s) : undefined;
  }

  /**
   * An id, name, entity, version or key from a record, shown in at most NAME_CHARS characters, escaped as text()
   * escapes. The items and the maps that correlate records are keyed by it, and the page names an escalation by it
   * (what a resolution carries is the record's own: openRaw), so two different ids are never shown alike: one
   * shown otherwise than it is (escaped, or with a `\` or `…` that an escape or a cut shows) carries the digest of
   * the whole (`(sha256 …)`), and so does one cut (`… (N characters, sha256 …)`); one shown as it is has neither
   * `\` nor `…`. Cut on whole escapes.
   */
  name(s: string): string {
    if (s.length <= NAME_CHARS) {
      const shown = printable(s);
      // `.` and `..` too: a browser takes them for path segments in the resolve route's URL
      if (shown === s && !s.includes("\\") && !s.includes("…") && s !== "." && s !== "..") return s;
      const marked = `${shown} (sha256 ${digestOf(s)})`;
      if (marked.length <= NAME_CHARS) return marked;
    }
    this.counts.cut++;
    const tail = `… (${s.length} characters, sha256 ${digestOf(s)})`;
    return `${shownPrefix(s, NAME_CHARS - tail.length, printable).text}${tail}`;
  }

  /**
   * A record as an owner read it, as the page shows it: its version shown as name() shows it and, when that is
   * not the version itself (escaped, or cut: one of 201 to 256 characters), the version too (`rawVersion`, only one
   * writ can carry: 1 to 256 characters), for the page to send back as the base version of an Apply on it (the
   * owner compares it with the record's own: the text shown would never match).
   */
  private recordShown(version: string, state: unknown): RecordShown {
    const shown = this.name(version);
    return { version: shown, state: this.clip(state), ...(shown !== version && Version.safeParse(version).success ? { rawVersion: version } : {}) };
  }

  private entityText(e: { type: string; id: string } | undefined | null): string | null {
    return e ? this.name(`${e.type}:${e.id}`) : null;
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
    const entity = this.entityText(intent.entity)!;
    const intentId = this.name(intent.intentId);
    const [agent, tool, baseVersion] = [this.name(intent.agent.id), this.name(intent.tool), this.name(intent.baseVersion)];
    this.remember(this.intentMeta, intentId, { agent, tool, entity, baseVersion }, this.correlationCap);
    if (!this.answered.has(intentId)) {
      this.track({
        kind: "intent",
        intentId,
        intentKey: this.name(intent.intentKey),
        entity,
        tool,
        agent,
        runId: this.name(intent.agent.runId),
        baseVersion,
        createdAt: this.name(intent.createdAt),
        where,
      });
    }
    this.changed("counts");
  }

  resolution(where: RecordRef, r: Resolution): void {
    if (!this.accept(where)) return;
    this.counts.resolutions++;
    const entity = this.entityText(r.entity)!;
    const resolutionId = this.name(r.resolutionId);
    const [by, tool, baseVersion] = [this.name(r.operator.id), this.name(r.intent.tool), r.baseVersion === undefined ? null : this.name(r.baseVersion)];
    this.remember(this.resolutions, resolutionId, { escalationId: this.name(r.escalationId), decision: r.decision, by }, this.correlationCap);
    this.remember(this.intentMeta, resolutionId, { agent: by, tool, entity, baseVersion: baseVersion ?? "" }, this.correlationCap);
    if (!this.answered.has(resolutionId)) {
      this.track({
        kind: "resolution",
        intentId: resolutionId,
        intentKey: this.name(r.intent.intentKey),
        entity,
        tool,
        agent: by,
        runId: null,
        baseVersion,
        decision: r.decision,
        createdAt: this.name(r.createdAt),
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
    const intentId = this.name(reply.intentId);
    this.remember(this.answered, intentId, true, this.correlationCap);
    if (this.inFlight.delete(intentId)) {
      this.dirty.add("inFlight");
    }
    const meta = this.intentMeta.get(intentId);
    const fromTopic = where.topic.startsWith(this.topics.replyPrefix) ? this.name(where.topic.slice(this.topics.replyPrefix.length)) : null;
    const r = reply as Reply & Record<string, unknown>;
    const entity = reply.status === "rejected" ? null : this.entityText(reply.entity);
    const item: ReplyItem = {
      intentId,
      intentKey: this.name(reply.intentKey),
      status: reply.status,
      duplicate: reply.duplicate,
      at: this.name(reply.at),
      entity: entity ?? meta?.entity ?? null,
      tool: meta?.tool ?? null,
      agent: meta?.agent ?? fromTopic,
      agentFromTopic: meta === undefined && fromTopic !== null,
      where,
    };
    if (typeof r.resolvedBy === "string") item.resolvedBy = this.name(r.resolvedBy);
    switch (reply.status) {
      case "applied":
        item.version = this.name(reply.version);
        item.via = this.name(reply.via);
        break;
      case "conflict":
        item.cycle = reply.cycle;
        item.message = this.text(reply.message);
        item.version = this.name(reply.current.version);
        break;
      case "rejected":
        item.reason = this.text(reply.reason);
        item.message = this.text(reply.message);
        break;
      case "escalated":
        item.reason = this.text(reply.reason);
        item.message = this.text(reply.message);
        item.escalationId = this.name(reply.escalationId);
        break;
    }
    this.counts[reply.status]++;
    if (reply.duplicate) this.counts.duplicate++;
    this.replies = [item, ...this.replies].slice(0, this.limits.recent);
    this.fresh.replies++;
    const sections: Section[] = ["replies", "counts"];
    if (reply.status === "conflict") {
      const conflict: ConflictItem = {
        intentId,
        intentKey: item.intentKey,
        at: item.at,
        entity: entity!,
        tool: item.tool,
        agent: item.agent,
        cycle: reply.cycle,
        message: item.message!,
        baseVersion: meta?.baseVersion ?? null,
        current: { version: item.version!, state: this.clip(reply.current.state) },
        yourChange: this.clip(reply.your_change),
        where,
      };
      this.conflicts = [conflict, ...this.conflicts].slice(0, this.limits.recent);
    this.fresh.conflicts++;
      sections.push("conflicts");
    }
    this.noteOutcome(intentId, item);
    this.changed(...sections);
  }

  /**
   * A reply that closes or answers an escalation: the agent's (escalated intent id) or the operator's (resolution
   * id). Any producer can write a reply topic, and a resolution on the intents topic: what one says is shown as
   * reported (`from: "reply"`), and leaves the escalation resolvable from the page.
   */
  private noteOutcome(intentId: string, reply: ReplyItem): boolean {
    const closing = closingOutcome(reply, reply.resolvedBy ?? null, "reply");
    const resolution = this.resolutions.get(intentId);
    if (resolution) {
      const item = this.escalations.get(resolution.escalationId);
      if (closing) return item ? this.close(item, closing) : false;
      if (!item) return false;
      if (reply.status === "rejected" && reply.reason === "resolution_not_applicable" && item.status === "open") {
        return this.close(item, { outcome: "not_open", from: "reply", by: resolution.by, at: reply.at, ...(reply.message !== undefined ? { message: reply.message } : {}) });
      }
      item.lastAttempt = {
        decision: resolution.decision,
        by: resolution.by,
        at: reply.at,
        status: reply.status,
        ...(reply.reason !== undefined ? { reason: reply.reason } : {}),
        ...(reply.message !== undefined ? { message: reply.message } : {}),
      };
      this.touch(item, "status");
      return true;
    }
    if (!closing) return false;
    const escalationId = this.escalationOfIntent.get(intentId);
    const item = escalationId === undefined ? undefined : this.escalations.get(escalationId);
    if (item) return this.close(item, closing);
    this.remember(this.earlyOutcomes, intentId, closing, this.correlationCap);
    return false;
  }

  /**
   * The owner's answer to this console's own decision is final (the page refuses another decision); a reply
   * read on a topic is only reported: it never replaces the console's answer, and a later one replaces it only
   * when it said not_open. The record a resolution needs is dropped only on a final answer.
   */
  private close(item: EscalationItem, outcome: ResolutionOutcome): boolean {
    const had = item.resolution;
    if (had?.from === "console" && (outcome.from === "reply" || had.outcome !== "not_open")) return false;
    if (had?.from === "reply" && outcome.from === "reply" && had.outcome !== "not_open") return false;
    if (item.status === "open") {
      this.counts.escalationsOpen--;
      this.counts.escalationsResolved++;
    }
    item.status = "resolved";
    item.resolution = outcome;
    if (outcome.from === "console") this.openRaw.delete(item.escalationId);
    this.dirty.add("counts");
    this.touch(item, "status");
    return true;
  }

  /**
   * Digest of what a second record for the same escalation id must repeat: the intent, the reason, the message,
   * and the version of the record it showed (an apply's default base: a copy showing a later one would have a
   * change made since the escalation written over).
   * Canonical JSON (key order does not count) for an intent an owner could have admitted; for a larger one, its
   * compact JSON (canonicalizing a megabyte costs a tenth of a second; it can be no owner's, and any difference
   * contests, which only refuses the page a decision).
   */
  private fingerprint(e: Escalation, intentJson: string): string {
    let text: string | undefined;
    if (intentJson.length <= this.limits.intentChars) {
      try {
        text = canonicalJson({ intent: e.intent, reason: e.reason, message: e.message, version: e.current?.version ?? null, state: e.current?.state ?? null });
      } catch {
        text = undefined;
      }
    }
    text ??= `${intentJson}\u0000${JSON.stringify([e.reason, e.message, e.current?.version ?? null, e.current?.state ?? null])}`;
    return createHash("sha256").update(text).digest("hex");
  }

  /**
   * An escalation read on writ.human. Kept only when keyed as an owner keys it (its intent's entity key). The
   * first record for an id is shown; a later one with another intent, reason, message or record version contests it (one of
   * them is forged; which, only the ledger says).
   */
  escalation(where: RecordRef, e: Escalation, key: string | null): void {
    if (!this.accept(where)) return;
    if (key !== entityKey(e.intent.entity)) {
      this.counts.escalationsMiskeyed++;
      this.changed("counts");
      return;
    }
    const escalationId = this.name(e.escalationId);
    const intentJson = JSON.stringify(e.intent);
    const kept = this.escalations.get(escalationId);
    if (kept) {
      if (kept.contested || this.fingerprints.get(escalationId) === this.fingerprint(e, intentJson)) return;
      kept.contested = { where };
      this.openRaw.delete(escalationId);
      this.touch(kept, "status");
      return;
    }
    const intentId = this.name(e.intent.intentId);
    const item: EscalationItem = {
      escalationId,
      reason: this.text(e.reason),
      message: this.text(e.message),
      at: this.name(e.at),
      entity: this.entityText(e.intent.entity)!,
      tool: this.name(e.intent.tool),
      agent: this.name(e.intent.agent.id),
      runId: this.name(e.intent.agent.runId),
      intentId,
      intentKey: this.name(e.intent.intentKey),
      cycles: e.cycles,
      baseVersion: this.name(e.intent.baseVersion),
      change: this.clip(e.intent.delta),
      params: this.clip(e.intent.params),
      current: e.current ? this.recordShown(e.current.version, e.current.state) : null,
      mayHaveWritten: e.mayHaveWritten === true || e.reason === "outcome_unknown",
      status: "open",
      where,
    };
    this.escalations.set(escalationId, item);
    this.fingerprints.set(escalationId, this.fingerprint(e, intentJson));
    this.escalationOfIntent.set(intentId, escalationId);
    // Of the record, only what a resolution carries, and only when it fits what an owner admits.
    if (intentJson.length <= this.limits.intentChars) {
      this.openRaw.set(escalationId, `{"escalationId":${JSON.stringify(e.escalationId)},"intent":${intentJson},"version":${JSON.stringify(e.current?.version ?? null)}}`);
    }
    this.counts.escalationsOpen++;
    const early = this.earlyOutcomes.get(intentId);
    if (early) {
      this.earlyOutcomes.delete(intentId);
      this.close(item, early);
    }
    this.evictEscalations();
    // Not kept (the list is full of open ones, it was the one evicted): counted; the pages' list is unchanged.
    if (this.escalations.get(escalationId) === item) this.touch(item, "whole");
    this.changed("counts");
  }

  /**
   * Past the limit the oldest resolved escalation goes. When every one kept is open, the newest (just read) is
   * not kept, and counted: an open one the operator may be deciding on the page never vanishes under them (its
   * resolve would 404), and the page says how many more wait.
   */
  private evictEscalations(): void {
    while (this.escalations.size > this.limits.escalations) {
      // Closed by this console's own decision first; then ones a reply reported closed (maybe forged).
      const resolved = [...this.escalations.values()].filter((item) => item.status === "resolved");
      let victim = resolved.find((item) => item.resolution?.from === "console") ?? resolved[0];
      if (victim === undefined) {
        victim = [...this.escalations.values()].at(-1)!;
        this.counts.escalationsDropped++;
      }
      this.escalations.delete(victim.escalationId);
      this.escalationOfIntent.delete(victim.intentId);
      this.openRaw.delete(victim.escalationId);
      this.fingerprints.delete(victim.escalationId);
      this.touched.delete(victim.escalationId);
      if (victim.status === "open") this.counts.escalationsOpen--;
      else this.counts.escalationsResolved--;
    }
  }

  deadLetter(where: RecordRef, d: DeadLetter): void {
    if (!this.accept(where)) return;
    const item: DeadLetterItem = {
      reason: this.text(d.reason),
      message: this.text(d.message),
      at: this.name(d.at),
      key: d.key === null ? null : this.name(d.key),
      source: { topic: this.name(d.source.topic), partition: d.source.partition, offset: this.name(d.source.offset) },
      originalBytes: d.originalBytes,
      truncated: d.truncated,
      sha256: this.name(d.sha256),
      where,
      sentBack: null,
    };
    const sent = this.sentBack.get(`${where.partition}:${where.offset}`)?.find((c) => this.sameRecord(item, c));
    if (sent !== undefined) item.sentBack = sent.to;
    this.counts.deadLetters++;
    this.deadLetters = [item, ...this.deadLetters].slice(0, this.limits.recent);
    this.fresh.deadLetters++;
    this.changed("deadLetters", "counts");
  }

  /**
   * A record of the intents topic (at `to`) that says it was sent back from the dead letter at `from` of
   * writ.dlq, with its key and the sha256 of its value: the dead letter shows it as sent back when they are
   * its own. Taken before the record is decoded (a record sent back too early may not decode yet).
   */
  redriven(to: RecordRef, from: SentBackFrom): void {
    const sent: SentBack = { to, key: from.key === null ? null : this.name(from.key), sha256: from.sha256 };
    const i = this.deadLetters.findIndex((d) => d.where.partition === from.partition && d.where.offset === from.offset);
    if (i < 0) {
      // Which one is the dead letter's own is known only when it comes: the first few claims are kept (a forged
      // one read first must not hide the real one).
      const k = `${from.partition}:${from.offset}`;
      const claims = this.sentBack.get(k) ?? [];
      if (claims.length < SENT_BACK_CLAIMS) this.sentBack.set(k, [...claims, sent]);
      return;
    }
    const item = this.deadLetters[i]!;
    if (item.sentBack !== null || !this.sameRecord(item, sent)) return;
    this.deadLetters[i] = { ...item, sentBack: to };
    this.markedSentBack.add(`${from.partition}:${from.offset}`);
    this.changed("deadLetters");
  }

  private sameRecord(item: DeadLetterItem, sent: SentBack): boolean {
    // a truncated dead letter's sha256 is the whole original's, as a record sent back from its source carries
    return item.key === sent.key && item.sha256 === sent.sha256;
  }

  /** The dead letter at this offset of writ.dlq, among the ones kept. */
  deadLetterAt(partition: number, offset: string): DeadLetterItem | undefined {
    return this.deadLetters.find((d) => d.where.partition === partition && d.where.offset === offset);
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

  /**
   * The escalation as far as a resolution needs it (id, intent, record version, from the record read on
   * writ.human), or why the page may not resolve it: unknown; closed by this console's own decision (a close a
   * reply reported leaves it resolvable: the owner answers resolution_not_applicable if it is closed);
   * contested by another record; or its intent too large to have been admitted.
   */
  resolvable(escalationId: string): { escalation: Escalation } | { refused: NotResolvable; item?: EscalationItem } {
    const item = this.escalations.get(escalationId);
    if (!item) return { refused: "escalation_unknown" };
    if (item.contested) return { refused: "escalation_contested", item };
    if (item.resolution?.from === "console") return { refused: "escalation_not_open", item };
    const raw = this.openRaw.get(escalationId);
    if (raw === undefined) return { refused: "escalation_too_large", item };
    const { escalationId: id, intent, version } = JSON.parse(raw) as { escalationId: string; intent: WriteIntent; version: string | null };
    return {
      escalation: { escalationId: id, reason: item.reason, message: item.message, intent, cycles: item.cycles, current: version === null ? null : { state: null, version }, at: item.at },
    };
  }

  escalationItem(escalationId: string): EscalationItem | undefined {
    return this.escalations.get(escalationId);
  }

  /**
   * The answer an owner gave to a resolution sent from this console (the feed may read it later, or not at all).
   * One that leaves the escalation open with the record as the owner read it (`details.current`: a
   * resolution_conflict, a resolution_delta_required) makes that the record the escalation shows: the page marks an
   * operator's change written against the earlier one. A resolution still takes its default base version from the
   * writ.human record (`resolvable`); the page always sends the one it shows.
   */
  resolutionAnswered(escalationId: string, decision: string, by: string, answer: { status: string; reason?: string; message?: string; at?: string; version?: string; details?: unknown }): void {
    const item = this.escalations.get(escalationId);
    if (!item) return;
    const a = {
      status: this.name(answer.status),
      at: this.name(answer.at ?? new Date().toISOString()),
      ...(answer.reason !== undefined ? { reason: this.text(answer.reason) } : {}),
      ...(answer.message ? { message: this.text(answer.message) } : {}),
      ...(answer.version !== undefined ? { version: this.name(answer.version) } : {}),
    };
    const closing = closingOutcome(a, by, "console");
    if (closing) this.close(item, closing);
    else if (a.status === "rejected" && a.reason === "resolution_not_applicable") this.close(item, { outcome: "not_open", from: "console", by, at: a.at, ...(a.message ? { message: a.message } : {}) });
    else {
      item.lastAttempt = { decision, by, at: a.at, status: a.status, ...(a.reason ? { reason: a.reason } : {}), ...(a.message ? { message: a.message } : {}) };
      const current = recordRead(answer.details);
      if (current) item.current = this.recordShown(current.version, current.state);
    }
    this.touch(item, "whole");
    this.changed("counts");
  }

  /** The owner's answer to a decision sent from the page, as the page shows it (AnswerShown): status, reason, message, version, via and details, bounded. */
  answerShown(answer: { status: string; reason?: unknown; message?: unknown; version?: unknown; via?: unknown; details?: unknown }): AnswerShown {
    const shown: AnswerShown = { status: this.name(answer.status) };
    if (typeof answer.reason === "string") shown.reason = this.text(answer.reason);
    if (typeof answer.message === "string") shown.message = this.text(answer.message);
    if (typeof answer.version === "string") shown.version = this.name(answer.version);
    if (typeof answer.via === "string") shown.via = this.name(answer.via);
    if (answer.details !== undefined) shown.details = this.clip(answer.details);
    return shown;
  }

  /** The ACL check's answer (src/doctor/acls.ts). */
  setTrust(check: AclCheck): void {
    this.trustCheck = check;
    this.changed("trust");
  }

  /** The ACL check's answer, null before it came. */
  get trust(): AclCheck | null {
    return this.trustCheck;
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
      trust: this.section("trust"),
    };
  }

  /**
   * The sections changed since the last changes, or null when none did; the escalations as what changed of them
   * (EscalationChanges): the pages have the rest, from their snapshot and the updates since.
   */
  changes(): ConsoleChanges | null {
    if (this.dirty.size === 0) return null;
    const out: ConsoleChanges = { at: new Date().toISOString() };
    for (const s of this.dirty) {
      if (s === "escalations") out.escalationChanges = this.escalationChanges();
      else if (s === "replies") out.replyChanges = { added: this.replies.slice(0, this.fresh.replies) };
      else if (s === "conflicts") out.conflictChanges = { added: this.conflicts.slice(0, this.fresh.conflicts) };
      else if (s === "deadLetters") out.deadLetterChanges = this.deadLetterChanges();
      else (out as Record<string, unknown>)[s] = this.section(s);
    }
    this.dirty.clear();
    this.touched.clear();
    this.fresh.replies = this.fresh.conflicts = this.fresh.deadLetters = 0;
    this.markedSentBack.clear();
    return out;
  }

  private deadLetterChanges(): DeadLetterChanges {
    const sentBack = this.deadLetters.filter((d) => this.markedSentBack.has(`${d.where.partition}:${d.where.offset}`)).map((d) => ({ where: d.where, sentBack: d.sentBack }));
    return { added: this.deadLetters.slice(0, this.fresh.deadLetters), sentBack };
  }

  private escalationChanges(): EscalationChanges {
    const out: EscalationChanges = { order: this.section("escalations").map(escalationPlace), added: [], changed: [] };
    for (const [id, how] of this.touched) {
      const e = this.escalations.get(id);
      if (e === undefined) continue;
      if (how === "whole") out.added.push({ ...e });
      else out.changed.push({ where: e.where, status: e.status, ...(e.resolution ? { resolution: e.resolution } : {}), ...(e.lastAttempt ? { lastAttempt: e.lastAttempt } : {}), ...(e.contested ? { contested: e.contested } : {}) });
    }
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
      case "trust":
        return this.trustCheck as ConsoleSnapshot[S];
      default:
        throw new Error(`unknown section ${String(s)}`);
    }
  }
}

/** The record an owner's refusal carries (`details.current`, as src/owner/resolution.ts puts it), when it is one. */
function recordRead(details: unknown): { version: string; state: unknown } | null {
  if (typeof details !== "object" || details === null || !("current" in details)) return null;
  const current = details.current;
  if (typeof current !== "object" || current === null || !("version" in current) || !("state" in current)) return null;
  return typeof current.version === "string" ? { version: current.version, state: current.state } : null;
}

/** The outcome of a reply that closes an escalation (carries `resolvedBy`), else null. */
function closingOutcome(reply: { status: string; reason?: string; message?: string; at?: string; version?: string }, by: string | null, from: ResolutionOutcome["from"]): ResolutionOutcome | null {
  const at = reply.at ?? new Date().toISOString();
  if (by === null) return null;
  if (reply.status === "applied") return { outcome: "applied", from, by, at, ...(reply.version ? { version: reply.version } : {}) };
  if (reply.status === "rejected" && reply.reason === "escalation_discarded") return { outcome: "discarded", from, by, at, ...(reply.message ? { message: reply.message } : {}) };
  if (reply.status === "rejected" && reply.reason === "returned_by_operator") return { outcome: "returned", from, by, at, ...(reply.message ? { message: reply.message } : {}) };
  return null;
}
