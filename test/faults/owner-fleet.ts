import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, type WriteStream } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { waitFor } from "../helpers/wait-for.ts";
import type { Rng } from "./rng.ts";

interface Owner {
  name: string;
  proc: ChildProcess;
  /** Set when the fleet itself ended this owner, so its exit is not counted as a crash. */
  endedBy?: "kill" | "stop";
  paused: boolean;
  /** Sessions (`p<partition> s<seq>`) this owner opened, with when it logged them. */
  sessions: Map<string, number>;
}

/** A zombie the fleet made: an owner paused past the session timeout and resumed. */
export interface Zombie {
  name: string;
  /** Sessions it held when it was paused: none of them may write after `resumedAt`. */
  sessions: string[];
  pausedAt: number;
  resumedAt: number;
}

/**
 * Owner processes of the fault suite. It keeps `target` owners alive, kills,
 * pauses and stops them on request, replaces any that die, and counts from
 * their own logs: kills (SIGKILL, by the fleet or a crash point), crashes it
 * did not cause, and rebalances (each group generation has one leader, which
 * logs its assignment).
 */
export class OwnerFleet {
  kills = 0;
  rebalances = 0;
  selfCrashes = 0;
  /** Exits the fleet did not cause (neither its SIGKILL nor the crash point's). */
  crashes = 0;
  readonly crashNotes: string[] = [];
  readonly zombies: Zombie[] = [];
  private readonly owners = new Set<Owner>();
  private target = 0;
  private seq = 0;
  private stopping = false;
  private readonly env: NodeJS.ProcessEnv;
  private readonly logDir: string;
  private readonly script: string;
  private readonly rng: Rng;

  constructor(opts: { env: NodeJS.ProcessEnv; logDir: string; script: string; rng: Rng }) {
    this.env = opts.env;
    this.logDir = opts.logDir;
    this.script = opts.script;
    this.rng = opts.rng;
  }

  get alive(): number {
    return this.owners.size;
  }

  start(count: number): void {
    this.target = count;
    while (this.owners.size < this.target) this.spawnOne();
  }

  /** SIGKILL a random owner; a replacement joins at once. */
  killOne(): string | null {
    const owner = this.pick();
    if (!owner) return null;
    owner.endedBy = "kill";
    this.kills++;
    owner.proc.kill("SIGKILL");
    return owner.name;
  }

  /** One more owner joins the group; returns its name. */
  join(): string {
    this.target++;
    return this.spawnOne();
  }

  /**
   * A random owner leaves cleanly (SIGTERM). The last one hands over: a successor joins first, so a leave always
   * happens (it used to be skipped, "(nobody) leaves", whenever an earlier leave had left a single owner).
   * Returns what happened, for the log, or null with no owner to stop.
   */
  leave(): string | null {
    const owner = this.pick();
    if (!owner) return null;
    const successor = this.target <= 1 ? this.join() : null;
    this.target--;
    owner.endedBy = "stop";
    owner.proc.kill("SIGTERM");
    return successor ? `${owner.name} leaves, handing over to ${successor} (joining)` : `${owner.name} leaves`;
  }

  /**
   * A zombie: SIGSTOP a random owner that owns something, keep it stopped for
   * `pauseMs` (past the session timeout, so the group moves its partitions on
   * and a new owner fences it), then SIGCONT. A replacement joins meanwhile.
   * Right after kills and leaves every live owner may still be rebalancing,
   * with nothing open: the pause waits (up to `waitMs`) for one that owns
   * something, instead of being skipped (a CI run's three-broker suite once
   * made no zombie at all that way).
   */
  async zombie(pauseMs: number, waitMs = 60_000): Promise<Zombie | null> {
    const owner = await waitFor(() => this.pick((o) => o.sessions.size > 0), { timeoutMs: waitMs, intervalMs: 200 }).catch(() => undefined);
    if (!owner) return null;
    const sessions = [...owner.sessions.keys()];
    const pausedAt = Date.now();
    owner.paused = true;
    owner.proc.kill("SIGSTOP");
    this.target++;
    this.spawnOne();
    await new Promise((r) => setTimeout(r, pauseMs));
    owner.proc.kill("SIGCONT");
    owner.paused = false;
    const z: Zombie = { name: owner.name, sessions, pausedAt, resumedAt: Date.now() };
    this.zombies.push(z);
    return z;
  }

  async stopAll(): Promise<void> {
    this.stopping = true;
    await Promise.all(
      [...this.owners].map(
        (o) =>
          new Promise<void>((resolve) => {
            o.proc.once("exit", () => resolve());
            o.endedBy = "stop";
            if (o.paused) o.proc.kill("SIGCONT");
            o.proc.kill("SIGTERM");
            setTimeout(() => o.proc.kill("SIGKILL"), 15_000).unref();
          }),
      ),
    );
  }

  private pick(filter: (o: Owner) => boolean = () => true): Owner | undefined {
    const list = [...this.owners].filter((o) => !o.endedBy && !o.paused && filter(o)).sort((a, b) => a.name.localeCompare(b.name));
    return list.length === 0 ? undefined : this.rng.pick(list);
  }

  private spawnOne(): string {
    const name = `fault-owner-${++this.seq}`;
    const log: WriteStream = createWriteStream(join(this.logDir, `${name}.log`));
    const proc = spawn(process.execPath, [this.script], {
      env: { ...this.env, WRIT_INSTANCE_ID: name },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const owner: Owner = { name, proc, paused: false, sessions: new Map() };
    this.owners.add(owner);
    proc.stdout!.pipe(log, { end: false });
    createInterface({ input: proc.stderr! }).on("line", (line) => {
      log.write(`${line}\n`);
      if (line.includes('"msg":"assignment"') && line.includes('"isLeader":true')) this.rebalances++;
      if (line.includes('"msg":"partition restored; owning it"')) {
        const partition = /"partition":(\d+)/.exec(line)?.[1];
        const session = /"session":(\d+)/.exec(line)?.[1];
        if (partition !== undefined && session !== undefined) owner.sessions.set(`p${partition} s${session}`, Date.now());
      }
    });
    proc.once("exit", (code, signal) => {
      this.owners.delete(owner);
      log.end();
      if (signal === "SIGKILL" && !owner.endedBy) {
        // The crash point between PATCH and commit (the owner kills itself there on purpose).
        this.kills++;
        this.selfCrashes++;
      } else if (!owner.endedBy || (owner.endedBy === "stop" && typeof code === "number" && code !== 0)) {
        this.crashes++;
        this.crashNotes.push(`${name} exited (code ${code}, signal ${signal}); see ${join(this.logDir, `${name}.log`)}`);
      }
      if (!this.stopping && this.owners.size < this.target) this.spawnOne();
    });
    return name;
  }
}
