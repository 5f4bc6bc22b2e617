/** Marks the process once the filter is in (a Symbol.for key: one filter even across copies of this module). */
const INSTALLED = Symbol.for("writ.hideKafkajsTimeoutWarning");

/** Whether `process.emitWarning(warning, typeOrOptions)` is the TimeoutNegativeWarning. */
function isTimeoutNegative(warning: unknown, typeOrOptions: unknown): boolean {
  if (warning instanceof Error) return warning.name === "TimeoutNegativeWarning";
  if (typeof typeOrOptions === "string") return typeOrOptions === "TimeoutNegativeWarning";
  return typeof typeOrOptions === "object" && typeOrOptions !== null && (typeOrOptions as { type?: unknown }).type === "TimeoutNegativeWarning";
}

/**
 * kafkajs 2.2.4 (its last release) schedules a timer with a negative delay in
 * its request queue, and Node 24 prints a TimeoutNegativeWarning for it once
 * per process. It is harmless (Node uses 1 ms). This drops that one warning,
 * process-wide, and nothing else: every other warning reaches Node's printing
 * and any `process.on("warning")` listener as before. Idempotent; the CLI,
 * `createWritClient` and `startRouter` call it.
 */
export function hideKafkajsTimeoutWarning(): void {
  const proc = process as NodeJS.Process & { [INSTALLED]?: true };
  if (proc[INSTALLED]) return;
  proc[INSTALLED] = true;
  const emit = process.emitWarning;
  process.emitWarning = function emitWarning(this: unknown, warning: string | Error, ...rest: unknown[]): void {
    if (isTimeoutNegative(warning, rest[0])) return;
    return (emit as (...args: unknown[]) => void).call(process, warning, ...rest);
  } as typeof process.emitWarning;
}
