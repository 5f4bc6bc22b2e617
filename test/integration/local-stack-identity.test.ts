// A local stack's start counts only its own broker (src/testing/local-stack.ts startBroker): a second stack, in a
// dir of its own but on the port the suite's broker holds, used to return as started, its JVM having failed to bind
// and the suite's broker answering there. It now fails, naming both clusters, and leaves nothing running.
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { Kafka, logLevel } from 'kafkajs';
import { formattedClusterId } from '../../src/testing/stack-process.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const NODE = join(ROOT, 'node_modules', '.bin', 'node');
const LOCAL_STACK = pathToFileURL(join(ROOT, 'src', 'testing', 'local-stack.ts')).href;
const shared = (inject('kafkaBrokers') || process.env['KAFKA_BROKERS'] || '').split(',')[0]?.trim() ?? '';

function node(script: string, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolvePromise) => {
    execFile(NODE, ['--input-type=module', '-e', script], { cwd: ROOT, env, timeout: timeoutMs, maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      resolvePromise({ code: error === null ? 0 : typeof error.code === 'number' ? error.code : 1, stdout, stderr });
    });
  });
}

async function clusterIdAt(broker: string): Promise<string> {
  const admin = new Kafka({ clientId: 'writ-stack-identity-test', brokers: [broker], logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  try {
    return (await admin.describeCluster()).clusterId;
  } finally {
    await admin.disconnect();
  }
}

describe('a second local stack on a port another stack holds', () => {
  const dir = mkdtempSync(join(tmpdir(), 'writ-stack-identity-'));
  const env: NodeJS.ProcessEnv = { ...process.env, WRIT_LOCAL_STACK_DIR: dir, WRIT_LOCAL_KAFKA_PORT: shared.slice(shared.lastIndexOf(':') + 1) };
  delete env['KAFKA_BROKERS'];

  afterAll(async () => {
    await node(`const m = await import(${JSON.stringify(LOCAL_STACK)}); await m.stopStack({ log: () => {} });`, env, 60_000);
    rmSync(dir, { recursive: true, force: true });
  });

  it("startBroker fails naming both cluster ids, rather than taking the other stack's broker for its own", async () => {
    expect(shared).toMatch(/^127\.0\.0\.1:\d+$/);
    const theirs = await clusterIdAt(shared);
    const started = await node(
      `const m = await import(${JSON.stringify(LOCAL_STACK)});
       try { await m.startBroker({ timeoutMs: 120000 }); console.log('started'); }
       catch (err) { console.error(err.name + ': ' + err.message); process.exit(3); }`,
      env,
      170_000,
    );
    const ours = formattedClusterId(join(dir, 'kafka-data'));
    expect(ours).toMatch(/^[A-Za-z0-9_-]{22}$/);
    expect(ours).not.toBe(theirs);
    expect(started.stdout).not.toContain('started');
    expect(started.code, started.stderr.slice(0, 4000)).toBe(3);
    expect(started.stderr).toContain(`PortServedByAnotherCluster: broker: ${shared} answers as a broker of cluster ${theirs}, not of this stack's cluster ${ours}`);
    // its JVM is gone (it exited on the taken port: no start again either), and the other stack's broker is untouched
    const pid = await node(`const m = await import(${JSON.stringify(LOCAL_STACK)}); console.log(String(m.brokerPid()));`, env, 60_000);
    expect(pid.stdout.trim()).toBe('undefined');
    expect(await clusterIdAt(shared)).toBe(theirs);
  });
});
