import { logLevel } from "kafkajs";
import { OWNER_GROUPS_WATCH, type KafkaLogEntry } from "../kafka-log.ts";
import type { OutageExplains, ScenarioReport } from "./report.ts";

/**
 * What `writ verify` saw of Kafka, the schema registry and the systems of record failing during a run, so that a
 * scenario that failed while one of them did is reported `incomplete`, naming the outage, rather than blamed on
 * the tool. Asking them after the failure (outageNow) misses an outage that is over by then: a broker back after a
 * few seconds leaves only replies that came too late. What is recorded instead is every sign of one as it happens:
 * the connection errors kafkajs logs for the run's owner and agents (a dropped connection only at debug level), the
 * registry not answering them, and the fault proxy not reaching a system. A sign excuses only what its outage can
 * cause: Kafka's and the registry's, replies and effects that did not come; a system's, those and its refusals.
 */

/** What failed: Kafka and the registry carry intents and replies; a system of record takes the writes. */
export type OutageSource = "kafka" | "registry" | "system";

/** One sign of an outage. */
export interface OutageSign {
  /** `Kafka`, `the schema registry`, or `the system of record <name>`. */
  what: string;
  source: OutageSource;
  /** Who saw it: `the owner`, `agent-a`, `the fault proxy`. */
  seenBy: string;
  message: string;
  /**
   * Kafka's routine, not an outage alone: a connection the broker closed (it closes idle ones after
   * `connections.max.idle.ms`, and at a SASL re-authentication), a request kafkajs failed and retries (a timeout, a
   * closed connection under it). It counts where a Kafka sign that is not routine (a connection error, a connect that
   * failed, a request failure kafkajs gave up on) was seen during the same scenario.
   */
  routine?: boolean;
}

/** The signs since a mark that count: how many, by what failed, and the last ones of them kept. */
export interface OutageSigns {
  count: number;
  bySource: Record<OutageSource, number>;
  signs: OutageSign[];
}

/** Signs kept per source for a description: a long outage logs a sign per reconnect attempt. */
const KEPT = 200;

/** How many signs of each class a run has seen: a mark is a copy. */
interface Tally {
  kafka: number;
  kafkaRoutine: number;
  registry: number;
  system: number;
}

/** Where the signs stood at a mark ({@link OutageWatch.mark}). */
export type OutageMark = Readonly<Tally & { seq: number }>;

const classOf = (sign: OutageSign): keyof Tally => (sign.source === "kafka" ? (sign.routine ? "kafkaRoutine" : "kafka") : sign.source);

/** The signs of a run, in order; a mark taken before a scenario gives those seen during it. */
export class OutageWatch {
  private seq = 0;
  private readonly tally: Tally = { kafka: 0, kafkaRoutine: 0, registry: 0, system: 0 };
  private readonly kept: Record<OutageSource, { seq: number; sign: OutageSign }[]> = { kafka: [], registry: [], system: [] };

  note(sign: OutageSign): void {
    this.tally[classOf(sign)]++;
    const kept = this.kept[sign.source];
    kept.push({ seq: this.seq++, sign });
    if (kept.length > KEPT) kept.shift();
  }

  /** Where the signs stand now. */
  mark(): OutageMark {
    return { ...this.tally, seq: this.seq };
  }

  /** The signs noted since `mark` that count: Kafka's routine ones only beside one that is not. */
  since(mark: OutageMark): OutageSigns {
    const kafka = this.tally.kafka - mark.kafka;
    const routine = kafka > 0;
    const bySource = { kafka: kafka + (routine ? this.tally.kafkaRoutine - mark.kafkaRoutine : 0), registry: this.tally.registry - mark.registry, system: this.tally.system - mark.system };
    const signs = Object.values(this.kept)
      .flat()
      .filter((k) => k.seq >= mark.seq && (routine || !k.sign.routine))
      .sort((a, b) => a.seq - b.seq)
      .map((k) => k.sign);
    return { count: bySource.kafka + bySource.registry + bySource.system, bySource, signs };
  }

  /**
   * A kafkajs log tap for a client of the run: its connection errors, as signs `seenBy` it. Not the owner's watch
   * for other groups of owners (OWNER_GROUPS_WATCH): its ListGroups connects to every broker in the metadata each
   * minute, and one the run never uses (a broker unreachable from here that leads none of its partitions) would
   * excuse every scenario; a failed round of it changes nothing for the run. The take-up look a partition's open
   * waits for is the owner's own client, and counts.
   */
  kafkaTap(seenBy: string): (entry: KafkaLogEntry) => void {
    return (entry) => {
      if (entry.client === OWNER_GROUPS_WATCH) return;
      const sign = kafkaOutageSign(entry);
      if (sign !== null) this.note({ what: "Kafka", source: "kafka", seenBy, ...sign });
    };
  }
}

/** The text of a kafkajs error that says a broker could not be reached, or dropped or timed out a request. */
const CONNECTION_TROUBLE =
  /Connection error|Connection timeout|Closed connection|closed connection|timed out|Not connected|Failed to connect|KafkaJSConnection|KafkaJSRequestTimeout|KafkaJSBrokerNotFound|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EPIPE|EHOSTUNREACH|ENETUNREACH|ENOTFOUND|socket hang up/;

/** Of those, a connection that failed or could not be made: never routine, retried or not. */
const CONNECTION_FAILED = /Connection error|Connection timeout|Failed to connect|KafkaJSConnectionError|KafkaJSBrokerNotFound|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EPIPE|EHOSTUNREACH|ENETUNREACH|ENOTFOUND/;

/**
 * A kafkajs log entry as a sign of a broker outage, else null: a connection error, timeout or drop (its own, or as
 * the cause of what kafkajs retries, or of a consumer's crash). A broker that closes a connection is said only at
 * debug level ("Kafka server has closed connection"); anything else at debug or info is routine (requests,
 * responses, our own disconnects). A broker's error answer (a leader moving, a coordinator loading) is not an
 * outage. `routine`: the broker closing a connection, or a request failure kafkajs retries (logged with its
 * `retryCount`; one it gives up on ends in an error or a consumer's crash, which is not routine); never a connect
 * that failed, retried or not (a broker or a load balancer that takes the connection and closes it at once).
 */
export function kafkaOutageSign(entry: KafkaLogEntry): { message: string; routine: boolean } | null {
  if (entry.namespace === "Connection" && entry.message === "Kafka server has closed connection") {
    const broker = typeof entry.extra.broker === "string" ? ` (${entry.extra.broker})` : "";
    return { message: `the broker closed a connection${broker}`, routine: true };
  }
  if (entry.level !== logLevel.ERROR && entry.level !== logLevel.WARN) return null;
  // "Response Fetch(…)" with an error code: a broker that answered.
  if (entry.namespace === "Connection" && entry.message.startsWith("Response ")) return null;
  const error = typeof entry.extra.error === "string" ? entry.extra.error : "";
  const text = error === "" || entry.message.includes(error) ? entry.message : `${entry.message}: ${error}`;
  if (!CONNECTION_TROUBLE.test(text)) return null;
  // BrokerPool says only why a connect to a broker failed (a connection closed during its handshake, say).
  const connectFailed = entry.namespace === "BrokerPool" || CONNECTION_FAILED.test(text);
  const retried = typeof entry.extra.retryCount === "number" && !text.startsWith("Crash");
  return { message: text, routine: retried && !connectFailed };
}

/** The signs as one line: by what failed, who saw it, and the first message of each; how many there were. */
export function describeOutage({ count, signs }: Pick<OutageSigns, "count" | "signs">): string {
  const byWhat = new Map<string, { seenBy: Set<string>; message: string }>();
  for (const s of signs) {
    const known = byWhat.get(s.what);
    if (known) known.seenBy.add(s.seenBy);
    else byWhat.set(s.what, { seenBy: new Set([s.seenBy]), message: s.message });
  }
  const parts = [...byWhat].map(([what, { seenBy, message }]) => `${what} (seen by ${[...seenBy].join(", ")}: ${message})`);
  return `${parts.join("; ")}${count > 1 ? `; ${count} signs in all` : ""}`;
}

/** The outages that can explain a failure, by what its problems can be explained by. */
const EXPLAINERS: Record<OutageExplains, readonly OutageSource[]> = { any: ["kafka", "registry", "system"], system: ["system"], none: [] };

/**
 * A failed scenario as the signs seen during it say it should be reported. None: a failure (the tool's). Some of an
 * outage that can explain every problem it found (`outageCanExplain`: Kafka, the registry or the system of record
 * for replies and effects that did not come; only the system of record for a rejection or an escalation):
 * `incomplete`, naming that outage. Else still a failure, as no outage seen excuses it: harm proven at the system
 * of record, a failure of the tool or its fixture, a refusal during an outage of Kafka alone; a note names the
 * outage.
 */
export function attributeFailure(report: ScenarioReport, seen: OutageSigns): ScenarioReport {
  if (report.status !== "fail" || seen.count === 0) return report;
  const explainers = report.harm ? [] : EXPLAINERS[report.outageCanExplain];
  const count = explainers.reduce((n, source) => n + seen.bySource[source], 0);
  if (count > 0) return { ...report, status: "incomplete", outage: describeOutage({ count, signs: seen.signs.filter((s) => explainers.includes(s.source)) }) };
  const outage = describeOutage(seen);
  const why =
    report.harm ? "what the system of record shows"
    : report.outageCanExplain === "system" ? "a rejection or an escalation, which only the system of record failing leads to"
    : "its problems, which are the tool's, its adapter's or its fixture's";
  return { ...report, notes: [...report.notes, `an outage during it (${outage}) does not explain ${why}`] };
}
