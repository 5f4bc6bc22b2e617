// How a `writ` command ends. kafkajs and pino leave timers behind, so a command that is done calls process.exit;
// but stdout and stderr are not always written synchronously: to a socket (what Node's child_process, and many
// harnesses and agent runtimes, give a child for its stdio) a large write is queued, and process.exit drops what the
// reader has not taken yet. A `writ escalations resolve --json` of a 146 KB answer, read by a busy parent, came out
// cut mid-string. So the exit waits until what was written has been handed to the OS.

/** Resolves once everything written to `stream` so far has been handed to the OS (at once when nothing is queued). */
export function written(stream: NodeJS.WritableStream & { writableLength?: number; destroyed?: boolean }): Promise<void> {
  return new Promise((resolve) => {
    if (stream.destroyed === true || (stream.writableLength ?? 0) === 0) return resolve();
    // The reader gone while output is queued (EPIPE): nothing more can be written, and the exit goes on with the
    // command's own status. The listener stays (the process is leaving): the stream emits its 'error' after the
    // write's callback, and without a listener that is an unhandled one (a stack trace and exit 1).
    stream.on("error", () => resolve());
    // An empty write's callback runs after every write queued before it, in order (with the error, if it fails).
    stream.write("", () => resolve());
  });
}

/**
 * process.exit(code) once stdout and stderr are written out (or their reader is gone). A reader that never reads
 * holds the exit, as a full pipe holds any Unix tool; a signal still ends the process.
 */
export async function exitWhenWritten(code: number): Promise<never> {
  await Promise.all([written(process.stdout), written(process.stderr)]);
  process.exit(code);
}
