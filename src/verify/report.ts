import type { JsonPatchOp } from "../schemas/common.ts";

/** What `runVerify` returns, and what `writ verify` prints as its last line. */

export const SCENARIOS = ["duplicate-submission", "commit-then-timeout", "commit-then-drop", "race"] as const;
export type ScenarioName = (typeof SCENARIOS)[number];

/** A change that was reported applied and is not in the final record. */
export interface LostUpdate {
  tool: string;
  /** `<type>:<id>` */
  entity: string;
  /** `agent-a`, `agent-b` (writ) or `outside-writer` (a direct write to the system of record). */
  writer: string;
  mark: string;
  /** The JSON Patch that was reported applied. */
  change: JsonPatchOp[];
  /** How it was reported applied, e.g. `writ replied applied at "v3"` or `the system answered 2xx at "v2"`. */
  reportedApplied: string;
  message: string;
}

/** A change found more than once in the record. */
export interface DuplicateEffect {
  writer: string;
  mark: string;
  effects: number;
}

export interface ScenarioReport {
  scenario: ScenarioName;
  /** True only when `status` is `pass`. */
  ok: boolean;
  /**
   * `pass`; `fail`: a problem below; `incomplete`: it failed while Kafka, the registry or its system of record
   * failed (`outage`), and that outage can explain every problem (`outageCanExplain`), or it found no problem but
   * did not exercise what it is there to prove (`notExercised`).
   */
  status: ToolStatus;
  /** What failed during it, where that makes it `incomplete`: what, who saw it, the first message, how many signs. */
  outage?: string;
  /**
   * A problem is proven at the system of record or on the wire (a lost update, a duplicate effect or write, a
   * stale write let through, an outcome the adapter made up, a rejection of a change the system shows made): no
   * outage excuses it, so it stays `fail`.
   */
  harm: boolean;
  /**
   * Which outage, seen during the scenario, can explain every one of its problems: `any` (replies or effects that
   * did not come: Kafka or the registry carrying them, or the system of record taking them, failed), `system` (a
   * rejection or an escalation: only the system of record failing leads an owner to one), `none` (harm, a failure
   * of the tool, its adapter or its fixture, such as an Idempotency-Key the fault could not match, or no problem).
   */
  outageCanExplain: OutageExplains;
  /**
   * Why the scenario, though it found no problem, proved nothing of what it is there for (the race: the owner's
   * stale PATCH did not come back 412 nor 2xx, so If-Match was not exercised): `incomplete`, never a pass; run it
   * again.
   */
  notExercised?: string;
  /** Effects of this scenario's changes, counted at the system of record after it ran. */
  effects: number;
  /** Effects there should be: one per change reported applied. */
  expectedEffects: number;
  /** Conflict replies the agents got, plus 412s the outside writer got. */
  conflicts: number;
  lostUpdates: LostUpdate[];
  duplicates: DuplicateEffect[];
  /** PATCH requests that carried the scenario's intent key(s) on the wire (proxy) or into the adapter. */
  patchesSent: number | null;
  /** Replies as the agents saw them, in order, e.g. `applied via reconcile`, `applied (duplicate)`, `conflict (cycle 1)`. */
  replies: string[];
  /** Where the fault was injected: the HTTP proxy, or simulated at the adapter (systems that are not HTTP). */
  faultInjection: "proxy" | "adapter" | null;
  /** Why the scenario failed; empty when it passed. */
  problems: string[];
  notes: string[];
  durationMs: number;
}

/** Which outage can explain a failed scenario's problems: see {@link ScenarioReport.outageCanExplain}. */
export type OutageExplains = "any" | "system" | "none";

/**
 * `pass`: every scenario asked for ran and passed; `fail`: one failed, or none could run (`problems`); `incomplete`:
 * none failed, and one failed during an outage of Kafka, the registry or the system of record (its `outage`), or
 * the run stopped (Kafka, the registry or the owner lost, or Ctrl-C) before all of them ran.
 */
export type ToolStatus = "pass" | "fail" | "incomplete";

export interface ToolReport {
  tool: string;
  system: string;
  /** `<type>:<id>` the scenarios wrote to. */
  entity: string;
  /** True only when `status` is `pass`. */
  ok: boolean;
  status: ToolStatus;
  /** The scenarios the run stopped before (the one under way included); present when it stopped in this tool. */
  notRun?: ScenarioName[];
  /** Sum of the scenarios' effects: the records created / changes made on staging by this run. */
  effects: number;
  conflicts: number;
  lostUpdates: LostUpdate[];
  scenarios: ScenarioReport[];
  /** Problems outside any scenario (no fixture, record missing, prepare failed). */
  problems: string[];
}

export interface VerifyReport {
  /** True only when `status` is `pass`. */
  ok: boolean;
  /**
   * `pass`: every tool passed; `fail`: a tool failed (also where the run then stopped); `incomplete`: none failed,
   * and the run stopped (`interrupted`) or a tool is `incomplete`.
   */
  status: ToolStatus;
  /** Prefix of every mark this run wrote, e.g. `wv-3f9a1c`. */
  runId: string;
  startedAt: string;
  durationMs: number;
  brokers: string[];
  /** System name → how its faults were injected and where it points. */
  systems: { name: string; faultInjection: "proxy" | "adapter"; upstream: string | null }[];
  tools: ToolReport[];
  /**
   * Present when the run was stopped (`signal`: Ctrl-C, SIGTERM), or when Kafka, the registry or the owner failed
   * after a scenario had already failed on its own: what ran until then is reported, and what did not run is named
   * (`<tool> <scenario>`, or a tool's name where none of its scenarios ran). Lost without an earlier failure, the
   * run is not reported: it could not run. `stopped`: true where the signal stopped it, false where an outage did.
   */
  interrupted?: { reason: string; notRun: string[]; stopped: boolean };
  /** Tools by status; `notRun`: tools of which no scenario ran (the run stopped before them). */
  summary: { pass: number; fail: number; incomplete: number; notRun: number };
  /** Present when the run's topics and groups could not be deleted at its end (Kafka did not answer). */
  leftovers?: VerifyLeftovers;
}

/** What a run left on the cluster because Kafka did not answer its cleanup, and how to delete it later. */
export interface VerifyLeftovers {
  runId: string;
  /** Why they could not be deleted. */
  reason: string;
  /** `writ.verify.<run>.*` and the agents' reply topics `writ.replies.verify.<run>.*`. */
  topics: string[];
  /** The owner's groups, by name. */
  groups: string[];
  /** Groups named by what their names start with: the agents' reply groups, `writ.client.verify-<run>-` and a random id. */
  groupPrefixes: string[];
  /** The command that deletes them once Kafka answers: `writ verify --cleanup <run> --brokers <list>`. */
  cleanup: string;
}

/** A tool's status as the table and the report's lines show it. */
const SHOWN: Record<ToolStatus, string> = { pass: "pass", fail: "FAIL", incomplete: "incomplete" };

/** The line that says what a run left on the cluster and the command that deletes it. */
export function leftoversLine(left: VerifyLeftovers): string {
  const names = [
    left.topics.length > 0 ? `topics ${left.topics.join(", ")}` : "",
    left.groups.length > 0 ? `groups ${left.groups.join(", ")}` : "",
    left.groupPrefixes.length > 0 ? `groups whose names start with ${left.groupPrefixes.join(", ")}` : "",
  ].filter(Boolean);
  return `left on the cluster (${left.reason}): ${names.join("; ")}; delete them with: ${left.cleanup}`;
}

function pad(text: string, width: number): string {
  return text.length >= width ? text : text + " ".repeat(width - text.length);
}

function table(rows: string[][]): string[] {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? "").length)));
  return rows.map((r) => r.map((cell, i) => (i === r.length - 1 ? cell : pad(cell, widths[i]!))).join("  ").trimEnd());
}

/** The report as a readable table, then one paragraph per failure. */
export function formatReport(report: VerifyReport): string {
  const lines: string[] = [];
  lines.push(`writ verify ${report.runId}: ${SHOWN[report.status].toUpperCase()} (${(report.durationMs / 1000).toFixed(1)} s, Kafka ${report.brokers.join(",")})`);
  for (const s of report.systems) {
    lines.push(`  system ${s.name}: ${s.faultInjection === "proxy" ? `faults injected by the HTTP proxy in front of ${s.upstream}` : "not HTTP: faults simulated at the adapter"}`);
  }
  if (report.interrupted) lines.push(`  stopped early: ${report.interrupted.reason}`, `  not run: ${report.interrupted.notRun.join(", ")}`);
  const { pass, fail, incomplete, notRun } = report.summary;
  lines.push(`  tools: ${pass} pass, ${fail} FAIL, ${incomplete} incomplete, ${notRun} not run`);
  if (report.leftovers) lines.push(`  ${leftoversLine(report.leftovers)}`);
  lines.push("");
  const rows: string[][] = [["tool", "scenario", "result", "effects", "conflicts", "lost", "PATCHes", "replies"]];
  for (const t of report.tools) {
    if (t.scenarios.length === 0 && !t.notRun) rows.push([t.tool, "-", "FAIL", "-", "-", "-", "-", t.problems.join("; ")]);
    for (const s of t.scenarios) {
      rows.push([
        t.tool,
        s.scenario,
        SHOWN[s.status],
        `${s.effects}/${s.expectedEffects}`,
        String(s.conflicts),
        String(s.lostUpdates.length),
        s.patchesSent === null ? "-" : String(s.patchesSent),
        s.replies.join(", "),
      ]);
    }
    for (const s of t.notRun ?? []) rows.push([t.tool, s, "not run", "-", "-", "-", "-", ""]);
  }
  lines.push(...table(rows));
  lines.push("");
  lines.push("effects: found at the system of record / expected (one per change reported applied)");
  for (const t of report.tools) {
    const notRun = t.notRun ? ` (not run: ${t.notRun.join(", ")})` : "";
    lines.push(`${t.tool} on ${t.entity}: ${SHOWN[t.status]}${notRun}; ${t.effects} effect(s) written, ${t.conflicts} conflict(s) seen, ${t.lostUpdates.length} lost update(s)`);
    for (const p of t.problems) lines.push(`  problem: ${p}`);
    for (const s of t.scenarios) {
      if (s.outage !== undefined) lines.push(`  ${s.scenario}: not judged: it failed during an outage of ${s.outage}; run it again`);
      else if (s.notExercised !== undefined && s.status === "incomplete") lines.push(`  ${s.scenario}: not judged: ${s.notExercised}; run it again`);
      if (s.notExercised !== undefined && (s.status !== "incomplete" || s.outage !== undefined)) lines.push(`  ${s.scenario}: note: ${s.notExercised}`);
      for (const p of s.problems) lines.push(`  ${s.scenario}: ${p}`);
      for (const n of s.notes) lines.push(`  ${s.scenario}: note: ${n}`);
    }
  }
  return lines.join("\n");
}
