import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, type WriteStream } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";

interface Owner {
  name: string;
  proc: ChildProcess;
  /** Set when the fleet itself ended this owner, so its exit is not counted again. */
  endedBy?: "kill" | "stop";
}

/**
 * Owner processes of the fault suite. It keeps `target` owners alive, kills
 * and stops them on request, replaces any that die, and counts from their own
 * logs: kills (SIGKILL, by the fleet or a crash point) and rebalances (each
 * group generation has one leader, which logs its assignment).
 */
export class OwnerFleet {
  kills = 0;
  rebalances = 0;
  selfCrashes = 0;
  private readonly owners = new Set<Owner>();
  private target = 0;
  private seq = 0;
  private stopping = false;
  private readonly env: NodeJS.ProcessEnv;
  private readonly logDir: string;
  private readonly script: string;

  constructor(opts: { env: NodeJS.ProcessEnv; logDir: string; script: string }) {
    this.env = opts.env;
    this.logDir = opts.logDir;
    this.script = opts.script;
  }

  get alive(): number {
    return this.owners.size;
  }

  start(count: number): void {
    this.target = count;
    while (this.owners.size < this.target) this.spawnOne();
  }

  /** SIGKILL a random owner; a replacement joins at once. */
  killOne(): void {
    const owner = this.pick();
    if (!owner) return;
    owner.endedBy = "kill";
    this.kills++;
    owner.proc.kill("SIGKILL");
  }

  /** One more owner joins the group. */
  join(): void {
    this.target++;
    this.spawnOne();
  }

  /** A random owner leaves cleanly (SIGTERM), leaving at least one. */
  leave(): void {
    if (this.target <= 1) return;
    const owner = this.pick();
    if (!owner) return;
    this.target--;
    owner.endedBy = "stop";
    owner.proc.kill("SIGTERM");
  }

  async stopAll(): Promise<void> {
    this.stopping = true;
    await Promise.all(
      [...this.owners].map(
        (o) =>
          new Promise<void>((resolve) => {
            o.proc.once("exit", () => resolve());
            o.endedBy = "stop";
            o.proc.kill("SIGTERM");
            setTimeout(() => o.proc.kill("SIGKILL"), 15_000).unref();
          }),
      ),
    );
  }

  private pick(): Owner | undefined {
    const list = [...this.owners].filter((o) => !o.endedBy);
    return list[Math.floor(Math.random() * list.length)];
  }

  private spawnOne(): void {
    const name = `fault-owner-${++this.seq}`;
    const log: WriteStream = createWriteStream(join(this.logDir, `${name}.log`));
    const proc = spawn(process.execPath, [this.script], {
      env: { ...this.env, WRIT_INSTANCE_ID: name },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const owner: Owner = { name, proc };
    this.owners.add(owner);
    proc.stdout!.pipe(log, { end: false });
    createInterface({ input: proc.stderr! }).on("line", (line) => {
      log.write(`${line}\n`);
      if (line.includes('"msg":"assignment"') && line.includes('"isLeader":true')) this.rebalances++;
    });
    proc.once("exit", (code, signal) => {
      this.owners.delete(owner);
      log.end();
      if (signal === "SIGKILL" && !owner.endedBy) {
        this.kills++;
        this.selfCrashes++;
      }
      if (!this.stopping && this.owners.size < this.target) this.spawnOne();
      void code;
    });
  }
}
