import { CompressionTypes } from "kafkajs";
import { describe, expect, it } from "vitest";
import { refundPayment } from "../../examples/demo-tools.ts";
import type { DeadLetter } from "../../src/schemas/dead-letter.ts";
import { startRecordingProxy } from "../helpers/recording-proxy.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { readVersion, refundIntent, registryUrl, startHarness } from "../helpers/writ-harness.ts";

/** A value framed in the Confluent wire format with `id`, whatever the registry says about it. */
function framed(id: number, json: string): Buffer {
  const header = Buffer.alloc(5);
  header.writeInt32BE(id, 1);
  return Buffer.concat([header, Buffer.from(json)]);
}

/** The sum of a counter's samples in Prometheus text, those whose labels include `labels`. */
function counter(text: string, name: string, labels = ""): number {
  let total = 0;
  for (const line of text.split("\n")) {
    const m = /^([a-z_]+)(\{[^}]*\})? (\S+)$/.exec(line);
    if (m && m[1] === name && (m[2] ?? "").includes(labels)) total += Number(m[3]);
  }
  return total;
}

describe("lookups of schema ids an owner has not seen", () => {
  // Any producer can frame a value with any int32. Each fresh id is a registry request; without a budget, a flood
  // of them reaches the registry (shared with every other client of the cluster) as fast as it answers.
  it("a flood of fresh ids reaches the registry at WRIT_REGISTRY_LOOKUPS_PER_S, each id once; every record is dead-lettered and the partition moves on", async () => {
    const registry = registryUrl();
    if (!registry) throw new Error("this test needs the schema registry (SCHEMA_REGISTRY_URL)");
    const h = await startHarness({ tools: [refundPayment], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const upstream = new URL(registry);
    const proxy = await startRecordingProxy(upstream.origin);
    // Well below what one partition's owner asks unbounded (the registry answers an unknown id in tens of ms).
    const perSecond = 2;
    const router = await h.startRouter({ config: { ...h.config, schemaRegistryUrl: `${proxy.url}${upstream.pathname}`, registryLookupsPerSecond: perSecond } });
    const agent = await h.client(`agent-ids-${h.id}`);

    // 16 values framed with ids the registry never handed out (it counts up from 1), then a good intent behind them.
    const ids = Array.from({ length: 16 }, (_, i) => 0x7e000000 + i);
    const body = JSON.stringify({ hello: "registry" });
    // One batch, so that the owner has them all at once: only the budget spaces the lookups.
    await h.produceBatch(ids.map((id) => ({ key: "payment:pay_1", value: framed(id, body) })), CompressionTypes.None);
    const reply = await agent.submit(refundIntent(`run-${h.id}`, (await readVersion(h.records, "payment", "pay_1")).version, 900));
    expect(reply.status).toBe("applied");

    // Nothing lost: each record is a dead letter that names its id.
    const dead = (await h.readTopic(h.config.topics.dlq, "DeadLetter", ids.length)) as DeadLetter[];
    expect(dead.map((d) => d.reason)).toEqual(ids.map(() => "undecodable"));
    expect(dead.map((d) => /schema id (\d+) is not in the registry/.exec(d.message)?.[1])).toEqual(ids.map(String));

    // Counted at the registry's door: each fresh id asked once, and never more than the budget allows in any window
    // (the burst, one second's worth, plus the rate over the window; one more for the clocks' difference).
    const lookups = proxy.seen.filter((r) => /\/schemas\/ids\/\d+\/versions$/.test(r.path));
    const asked = lookups.map((r) => Number(/\/ids\/(\d+)\//.exec(r.path)?.[1])).filter((id) => ids.includes(id));
    expect(asked.sort((a, b) => a - b)).toEqual(ids);
    const at = lookups.map((r) => r.at).sort((a, b) => a - b);
    for (let i = 0; i < at.length; i++) {
      for (let j = i; j < at.length; j++) {
        const allowed = perSecond + 1 + (perSecond * (at[j]! - at[i]!)) / 1000;
        expect(j - i + 1, `lookups ${i}..${j} within ${Math.round(at[j]! - at[i]!)} ms`).toBeLessThanOrEqual(allowed);
      }
    }

    // Said where an operator looks.
    let text = "";
    await waitFor(async () => counter((text = await router.metrics()), "writ_registry_id_lookups_total", 'outcome="unknown"') === ids.length, {
      timeoutMs: 10_000,
      message: () => `writ_registry_id_lookups_total: ${text.split("\n").filter((l) => l.startsWith("writ_registry")).join("; ")}`,
    });
    expect(counter(text, "writ_registry_id_lookup_wait_seconds_total")).toBeGreaterThan(0);
  }, 90_000);
});
