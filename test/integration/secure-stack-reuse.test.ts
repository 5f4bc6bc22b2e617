// A secure stack left running by a run that was killed (npm test's shared one, scripts/test.mjs) is reused by the
// next run only where it serves (src/testing/secure-stack.ts ensureSecureStack): a registry that died is started
// again, and a stack whose start never finished (no tenants file: its starter was killed mid-start) is started
// afresh. Both used to be errors ("runs without its registry", "runs without tenant …"), failing every secure suite
// until someone ran kafka:down. A registry that runs but does not answer is waited for, never replaced (its users'
// schemas are in its memory). `kafka:up -- --secure` that starts only the registry again says "registry restarted"
// (its Python caller took "started" for the whole stack, and stopped the broker too), and `kafka:down -- --secure
// --registry-only` stops that registry alone. A stack of its own: its dir and ports, below the ephemeral range.
import { execFile } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { Agent, fetch } from 'undici';
import { afterAll, describe, expect, it } from 'vitest';
import { ensureSecureStack, stopSecureStack, type SecureStackOptions } from '../../src/testing/secure-stack.ts';
import { isAlive, signal } from '../../src/testing/stack-process.ts';
import type { EnsureStackResult } from '../../src/testing/local-stack.ts';

import { waitFor } from '../helpers/wait-for.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const DIR = join(ROOT, '.cache', 'run-secure-reuse-test');
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

/** scripts/<name> (kafka-up.ts, kafka-down.ts) for this file's stack: its dir and ports. */
async function script(name: string, ...args: string[]): Promise<{ stdout: string; stderr: string }> {
  const env = { ...process.env, WRIT_SECURE_STACK_DIR: DIR, WRIT_SECURE_KAFKA_PORT: String(OPTS.kafkaPort), WRIT_SECURE_REGISTRY_PORT: String(OPTS.registryPort) };
  return promisify(execFile)(process.execPath, [join(ROOT, 'scripts', name), ...args], { cwd: ROOT, env, timeout: 240_000 });
}

describe('reusing a secure stack left running', () => {
  afterAll(async () => {
    await stopSecureStack({ dir: DIR, log: () => undefined });
    rmSync(DIR, { recursive: true, force: true });
  });

  it('its registry paused: waited for, not replaced; died: the broker is reused and the registry started again (kafka:up saying so, kafka:down stopping it alone); a start that never finished: started afresh', async () => {
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

    // the registry dies, as a runner's would with it; the broker goes on serving. `kafka:up -- --secure` starts it
    // again and says so, not "started": whoever reads that (python/src/writ_client/devstack.py) then stops the whole
    // stack, the broker others use with it
    process.kill(registry, 'SIGKILL');
    await waitFor(() => !isAlive(registry), { message: `registry pid ${registry} still alive after SIGKILL` });
    const up = await script('kafka-up.ts', '--secure', '--tenant', 'reuse');
    expect(up.stderr).toContain(`the secure broker at 127.0.0.1:22292 serves, its registry does not; starting the registry again`);
    expect(up.stderr).toMatch(/^\[secure-stack\] registry restarted in .*kafka:down -- --secure --registry-only$/m);
    expect(up.stderr).not.toMatch(/^\[secure-stack\] started in/m);
    expect(pidOf('broker')).toBe(broker);
    const restarted = pidOf('registry');
    expect(restarted).not.toBe(registry);
    const second = await ensureSecureStack(OPTS);
    expect(second.started).toBe(false);
    // the same certificate and password as the broker's clients were given
    expect(second.secure!.registryAuth.password).toBe(first.secure!.registryAuth.password);
    expect(await registryStatus(second)).toBe(200);
    expect(second.secure!.tenant('reuse').users['agent-a'].password).toBe(password);
    // what it says to run stops that registry alone
    const down = await script('kafka-down.ts', '--secure', '--registry-only');
    expect(down.stdout).toBe(`stopped secure registry (pid ${restarted})\n`);
    expect(isAlive(restarted)).toBe(false);
    expect(isAlive(broker)).toBe(true);

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
