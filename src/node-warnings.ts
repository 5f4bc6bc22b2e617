/**
 * kafkajs 2.2.4 (its last release) schedules a timer with a negative delay in
 * its request queue, and Node 24 prints a TimeoutNegativeWarning for it once
 * per process. It is harmless (Node uses 1 ms); entry points call this to hide
 * that one warning and print every other one as Node would.
 */
export function hideKafkajsTimeoutWarning(): void {
  process.removeAllListeners("warning");
  process.on("warning", (w) => {
    if (w.name !== "TimeoutNegativeWarning") process.stderr.write(`(node:${process.pid}) ${w.name}: ${w.message}\n`);
  });
}
