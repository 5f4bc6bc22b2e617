// The Kafka distribution's own ConsoleProducer (a Java child process) with record headers, for the
// hostile-input suite: the foreign producer whose records carry a `writ-signature` header (or a header
// with a null value, which no kafkajs producer can send). scripts/kafka-cli.ts's consoleProduce has no
// header mode, so this runs ConsoleProducer itself with `parse.headers=true`; pinned partitions and
// header-less garbage still go through consoleProduce.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { KAFKA_LIBS } from "../../src/testing/local-stack.ts";

export type JavaCompression = "none" | "gzip" | "snappy" | "lz4" | "zstd";

export interface JavaRecord {
  key: string | null;
  /** UTF-8 text without CR/LF. */
  value: string;
  /** Header name → value; `null` sends a header whose value is null (Kafka allows it, kafkajs cannot produce it). */
  headers?: Record<string, string | null>;
}

export interface JavaProduceOptions {
  brokers: string[];
  topic: string;
  records: JavaRecord[];
  compression: JavaCompression;
  /** `murmur2`: the Java client's default partitioner (as writ's clients); `round-robin`: every record on the next partition, whatever its key. */
  partitioner: "murmur2" | "round-robin";
}

const JVM_FLAGS = ["-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"];

function token(kind: string, texts: string[]): string {
  for (;;) {
    const t = `<hostile-${kind}-${randomBytes(5).toString("hex")}>`;
    if (!texts.some((x) => x.includes(t))) return t;
  }
}

/** Produces `records` in one ConsoleProducer run (one batch per partition, compressed with `compression`); resolves when it exited cleanly. */
export async function javaProduce(opts: JavaProduceOptions): Promise<void> {
  const texts = opts.records.flatMap((r) => [r.key ?? "", r.value, ...Object.entries(r.headers ?? {}).flatMap(([k, v]) => [k, v ?? ""])]);
  for (const t of texts) if (/[\r\n]/.test(t)) throw new Error("java-producer: CR/LF cannot be carried by the console producer");
  const keySep = token("ksep", texts);
  const hDelim = token("hdelim", texts);
  const hSep = token("hsep", texts);
  const hKeySep = token("hksep", texts);
  const nullMarker = token("null", [...texts, keySep, hDelim, hSep, hKeySep]);
  const lines = opts.records.map((r) => {
    // A line always carries at least one header, so that the reader finds the header delimiter.
    const headers = { "writ-hostile": "java", ...(r.headers ?? {}) };
    const h = Object.entries(headers)
      .map(([k, v]) => `${k}${hKeySep}${v === null ? nullMarker : v}`)
      .join(hSep);
    return `${h}${hDelim}${r.key === null ? nullMarker : r.key}${keySep}${r.value}`;
  });
  const args = [
    ...JVM_FLAGS,
    "-cp",
    join(KAFKA_LIBS, "*"),
    "org.apache.kafka.tools.ConsoleProducer",
    "--bootstrap-server",
    opts.brokers.join(","),
    "--topic",
    opts.topic,
    "--compression-codec",
    opts.compression,
    ...["parse.key=true", `key.separator=${keySep}`, "parse.headers=true", `headers.delimiter=${hDelim}`, `headers.separator=${hSep}`, `headers.key.separator=${hKeySep}`, `null.marker=${nullMarker}`].flatMap(
      (p) => ["--reader-property", p],
    ),
    ...["acks=all", "linger.ms=200", ...(opts.partitioner === "round-robin" ? ["partitioner.class=org.apache.kafka.clients.producer.RoundRobinPartitioner"] : [])].flatMap((p) => ["--command-property", p]),
  ];
  const out = await new Promise<{ code: number | null; output: string }>((resolve, reject) => {
    const child = spawn("java", args, { stdio: ["pipe", "pipe", "pipe"] });
    let output = "";
    const timer = setTimeout(() => child.kill("SIGKILL"), 180_000);
    child.stdout.on("data", (d: Buffer) => (output += d.toString()));
    child.stderr.on("data", (d: Buffer) => (output += d.toString()));
    child.on("error", (err) => {
      clearTimeout(timer);
      reject(new Error(`java-producer: could not run java: ${err.message}`));
    });
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
    child.stdin.on("error", () => {});
    child.stdin.end(Buffer.from(`${lines.join("\n")}\n`, "utf8"));
  });
  if (out.code !== 0 || /Error when sending message|ERROR|Exception/.test(out.output)) {
    throw new Error(`java-producer: ConsoleProducer (${opts.records.length} records, ${opts.compression}, ${opts.partitioner}) failed (exit ${String(out.code)}):\n${out.output.slice(-3000)}`);
  }
}
