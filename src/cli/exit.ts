// How a `writ` command ends. kafkajs and pino leave timers behind, so a command that is done calls process.exit;
// but stdout and stderr are not always written synchronously: to a socket (what Node's child_process, and many
// harnesses and agent runtimes, give a child for its stdio) a large write is queued, and process.exit drops what the
// reader has not taken yet. A `writ escalations resolve --json` of a 146 KB answer, read by a busy parent, came out
// cut mid-string. So the exit waits until what was written has been handed to the OS.

/** Resolves once everything written to `stream` so far has been handed to the OS (at once when nothing is queued). */
export function written(stream: NodeJS.WritableStream & { writableLength?: number; destroyed?: boolean }): Promise<void> {
  return new Promise((resolve) => {
    if (stream.destroyed === true || (stream.writableLength ?? 0) === 0) return resolve();
    // An empty write's callback runs after every write queued before it, in order; it errors where the stream
    // does (the reader gone: the command's EPIPE handler ends the process).
    stream.write("", () => resolve());
  });
}

/** process.exit(code) once stdout and stderr are written out. */
export async function exitWhenWritten(code: number): Promise<never> {
  await Promise.all([written(process.stdout), written(process.stderr)]);
  process.exit(code);
}
