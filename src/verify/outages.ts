import { logLevel } from "kafkajs";
import type { KafkaLogEntry } from "../kafka-log.ts";
import type { ScenarioReport } from "./report.ts";

/**
 * What `writ verify` saw of Kafka, the schema registry and the systems of record failing during a run, so that a
 * scenario that failed while one of them did is reported `incomplete`, naming the outage, rather than blamed on
 * the tool. Asking them after the failure (outageNow) misses an outage that is over by then: a broker back after a
 * few seconds leaves only replies that came too late. What is recorded instead is every sign of one as it happens:
 * the connection errors kafkajs logs for the run's owner and agents (a dropped connection only at debug level), the
 * registry not answering them, and the fault proxy not reaching a system.
 */

/** One sign of an outage. */
export interface OutageSign {
  /** `Kafka`, `the schema registry`, or `the system of record <name>`. */
  what: string;
  /** Who saw it: `the owner`, `agent-a`, `the fault proxy`. */
  seenBy: string;
  message: string;
}

/** What the signs since a mark were: how many, and the last ones of them kept. */
export interface OutageSigns {
  count: number;
  signs: OutageSign[];
}

/** Signs kept for a description: a long outage logs a sign per reconnect attempt. */
const KEPT = 200;

/** The signs of a run, in order; a mark taken before a scenario gives those seen during it. */
export class OutageWatch {
  private seen = 0;
  private readonly kept: { seq: number; sign: OutageSign }[] = [];

  note(sign: OutageSign): void {
    this.kept.push({ seq: this.seen++, sign });
    if (this.kept.length > KEPT) this.kept.shift();
  }

  /** Where the signs stand now. */
  mark(): number {
    return this.seen;
  }

  /** The signs noted since `mark`. */
  since(mark: number): OutageSigns {
    return { count: this.seen - mark, signs: this.kept.filter((k) => k.seq >= mark).map((k) => k.sign) };
  }

  /** A kafkajs log tap for a client of the run: its connection errors, as signs `seenBy` it. */
  kafkaTap(seenBy: string): (entry: KafkaLogEntry) => void {
    return (entry) => {
      const message = kafkaOutageMessage(entry);
      if (message !== null) this.note({ what: "Kafka", seenBy, message });
    };
  }
}

/** The text of a kafkajs error that says a broker could not be reached, or dropped or timed out a request. */
const CONNECTION_TROUBLE =
  /Connection error|Connection timeout|Closed connection|closed connection|timed out|Not connected|Failed to connect|KafkaJSConnection|KafkaJSRequestTimeout|KafkaJSBrokerNotFound|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EPIPE|EHOSTUNREACH|ENETUNREACH|ENOTFOUND|socket hang up/;

/**
 * The message of a kafkajs log entry that is a sign of a broker outage, else null: a connection error, timeout or
 * drop (its own, or as the cause of what kafkajs retries, or of a consumer's crash). A broker that closes a
 * connection is said only at debug level ("Kafka server has closed connection"); anything else at debug or info
 * is routine (requests, responses, our own disconnects). A broker's error answer (a leader moving, a coordinator
 * loading) is not an outage.
 */
export function kafkaOutageMessage(entry: KafkaLogEntry): string | null {
  if (entry.namespace === "Connection" && entry.message === "Kafka server has closed connection") {
    const broker = typeof entry.extra.broker === "string" ? ` (${entry.extra.broker})` : "";
    return `the broker closed a connection${broker}`;
  }
  if (entry.level !== logLevel.ERROR && entry.level !== logLevel.WARN) return null;
  // "Response Fetch(…)" with an error code: a broker that answered.
  if (entry.namespace === "Connection" && entry.message.startsWith("Response ")) return null;
  const error = typeof entry.extra.error === "string" ? entry.extra.error : "";
  const text = error === "" || entry.message.includes(error) ? entry.message : `${entry.message}: ${error}`;
  return CONNECTION_TROUBLE.test(text) ? text : null;
}

/** The signs as one line: by what failed, who saw it, and the first message of each; how many there were. */
export function describeOutage({ count, signs }: OutageSigns): string {
  const byWhat = new Map<string, { seenBy: Set<string>; message: string }>();
  for (const s of signs) {
    const known = byWhat.get(s.what);
    if (known) known.seenBy.add(s.seenBy);
    else byWhat.set(s.what, { seenBy: new Set([s.seenBy]), message: s.message });
  }
  const parts = [...byWhat].map(([what, { seenBy, message }]) => `${what} (seen by ${[...seenBy].join(", ")}: ${message})`);
  return `${parts.join("; ")}${count > 1 ? `; ${count} signs in all` : ""}`;
}

/**
 * A failed scenario as the signs seen during it say it should be reported. None: a failure (the tool's). Some,
 * and nothing proven at the system of record (`harm`: a lost update, a duplicate, a stale write let through, an
 * answer the adapter made up): `incomplete`, naming the outage, since the replies or effects that did not come may
 * be the outage's. Some, with harm proven: still a failure, as no outage excuses it; a note names the outage.
 */
export function attributeFailure(report: ScenarioReport, seen: OutageSigns): ScenarioReport {
  if (report.status !== "fail" || seen.count === 0) return report;
  const outage = describeOutage(seen);
  if (report.harm) return { ...report, notes: [...report.notes, `an outage during it (${outage}) does not explain what the system of record shows`] };
  return { ...report, status: "incomplete", outage };
}
