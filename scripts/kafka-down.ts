// npm run kafka:down — stop the broker and registry started by kafka:up (or by a
// test run that was interrupted), found through the pid files in .cache/run.
import { stopStack } from './local-stack.ts';

try {
  const stopped = await stopStack();
  const parts = Object.entries(stopped).map(([name, pid]) => `${name} (pid ${pid})`);
  process.stdout.write(parts.length > 0 ? `stopped ${parts.join(', ')}\n` : 'nothing to stop\n');
  process.exit(0);
} catch (err) {
  process.stderr.write(`[local-stack] failed: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
}
