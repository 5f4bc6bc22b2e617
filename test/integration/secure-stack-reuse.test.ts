// A secure stack left running by a run that was killed (npm test's shared one, scripts/test.mjs) is reused by the
// next run only where it serves (src/testing/secure-stack.ts ensureSecureStack): a registry that died is started
// again (one that runs but does not answer is waited for, never replaced), and a stack whose start never finished
// (no tenants file: its starter was killed mid-start) is started afresh. Both used to be errors ("runs without its
// registry", "runs without tenant …"), failing every secure suite until someone ran kafka:down. A stack of its own:
// its dir and ports, below the ephemeral range.
import { readFileSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Agent, fetch } from 'undici';
import { afterAll, describe, expect, it } from 'vitest';
import { ensureSecureStack, stopSecureStack, type SecureStackOptions } from '../../src/testing/secure-stack.ts';
import { isAlive, signal } from '../../src/testing/stack-process.ts';
import type { EnsureStackResult } from '../../src/testing/local-stack.ts';

import { waitFor } from '../helpers/wait-for.ts';

const DIR = join(resolve(import.meta.dirname, '../..'), '.cache', 'run-secure-reuse-test');
const said: string[] = [];
const OPTS: SecureStackOptions = { dir: DIR, kafkaPort: 22292, registryPort: 22281, tenants: ['reuse'], log: (l) => said.push(l) };
const pidOf = (component: 'broker' | 'registry'): number => Number(readFileSync(join(DIR, `${component}.pid`), 'utf8').trim());

/** GET /subjects over HTTPS with the stack's CA and the registry's basic auth: 200 while it serves. */
async function registryStatus(stack: EnsureStackResult): Promise<number> {
  const s = stack.secure!;
  const dispatcher = new Agent({ connect: { ca: readFileSync(s.caFile, 'utf8') } });
  try {
    const auth = Buffer.from(`${s.registryAuth.username}:${s.registryAuth.password}`).toString('base64');
    const res = await fetch(`${s.registryUrl}/subjects`, { headers: { authorization: `Basic ${auth}` }, dispatcher, signal: AbortSignal.timeout(5000) });
    await res.arrayBuffer();
    return res.status;
  } finally {
    await dispatcher.close();
  }
}

describe('reusing a secure stack left running', () => {
  afterAll(async () => {
    await stopSecureStack({ dir: DIR, log: () => undefined });
    rmSync(DIR, { recursive: true, force: true });
  });

  it('its registry paused: waited for, not replaced; died: the broker is reused and the registry started again; a start that never finished: started afresh', async () => {
    await stopSecureStack({ dir: DIR, log: () => undefined }); // a stack of an earlier run of this file
    const first = await ensureSecureStack(OPTS);
    expect(first.started).toBe(true);
    const broker = pidOf('broker');
    const registry = pidOf('registry');
    // read now: a tenant's users are read from the stack's files when asked for
    const password = first.secure!.tenant('reuse').users['agent-a'].password;
    expect(await registryStatus(first)).toBe(200);

    // the registry runs but does not answer (paused, as a JVM in a long GC or on a loaded machine can seem): it is
    // someone's in use, with their schemas in its in-memory database, so it is waited for, never replaced
    process.kill(registry, 'SIGSTOP');
    let waited: Promise<EnsureStackResult> | undefined;
    try {
      await expect(ensureSecureStack({ ...OPTS, registryWaitMs: 1000 })).rejects.toThrow(/runs but did not answer/);
      expect(pidOf('registry')).toBe(registry);
      expect(isAlive(registry)).toBe(true);
      said.length = 0;
      waited = ensureSecureStack(OPTS);
      await waitFor(() => said.some((l) => l.includes(`(pid ${registry}) runs but does not answer`)), { message: () => `not waiting for the paused registry: ${said.join(' | ')}` });
    } finally {
      signal(registry, 'SIGCONT'); // quiet when it is gone: the assertion that failed says why
    }
    const resumed = await waited!;
    expect(resumed.started).toBe(false);
    expect(pidOf('registry')).toBe(registry);
    expect(pidOf('broker')).toBe(broker);

    // the registry dies, as a runner's would with it; the broker goes on serving
    process.kill(registry, 'SIGKILL');
    await waitFor(() => !isAlive(registry), { message: `registry pid ${registry} still alive after SIGKILL` });
    said.length = 0;
    const second = await ensureSecureStack(OPTS);
    expect(second.started).toBe(true);
    expect(pidOf('broker')).toBe(broker);
    expect(pidOf('registry')).not.toBe(registry);
    expect(said).toContain(`the secure broker at 127.0.0.1:22292 serves, its registry does not; starting the registry again`);
    // the same certificate and password as the broker's clients were given
    expect(second.secure!.registryAuth.password).toBe(first.secure!.registryAuth.password);
    expect(await registryStatus(second)).toBe(200);
    expect(second.secure!.tenant('reuse').users['agent-a'].password).toBe(password);

    // a start killed before its end: the broker serves but the tenants file (written last) is not there
    rmSync(join(DIR, 'tenants'));
    said.length = 0;
    const third = await ensureSecureStack({ ...OPTS, registry: false });
    expect(third.started).toBe(true);
    expect(said[0]).toContain('serves, but its start never finished');
    expect(isAlive(broker)).toBe(false);
    expect(pidOf('broker')).not.toBe(broker);
    expect(readFileSync(join(DIR, 'tenants'), 'utf8')).toBe('reuse\n');
    expect(third.secure!.tenant('reuse').users['agent-a'].password).not.toBe(password);
  }, 300_000); // two starts of a broker and two of a registry, on a CI machine's two cores
});
