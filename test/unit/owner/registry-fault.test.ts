// An owner whose schema registry refuses writ's own request (its login: 401): the
// record's result waits, as in an outage, and nothing is passed over. The codec is writ's, against a fake registry.
import { afterEach, describe, expect, it, vi } from "vitest";
import { WireCodec } from "../../../src/codec.ts";
import { json, startStub } from "../../helpers/http-stub.ts";
import { waitFor } from "../../helpers/wait-for.ts";
import { intentRecord, ownerWith, txns } from "./partition-owner-harness.ts";

vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith() };
});

afterEach(() => {
  txns.length = 0;
});

const committed = () => txns.filter((t) => t.committed);

describe("an owner whose registry refuses writ's request", () => {
  // Regression: only a retriable registry error paused the work. A 401 or 404 at registration now throws, not
  // retriable (before, it silently wrote plain JSON); taken for a fault of the record, the dead letter it would become
  // needs the registry too, so the record's offset passed with nothing written for it.
  it("holds the record's dead letter until the registry lets writ register, then writes it", async () => {
    let denied = true;
    const registry = await startStub((req, res) => {
      if (req.method === "POST" && req.path === "/subjects/writ.dlq-value/versions" && denied) return json(res, 401, { error_code: 40101, message: "Unauthorized" });
      if (req.method === "POST") return json(res, 200, { id: 7 });
      json(res, 200, { schemaType: "JSON", schema: "{}" });
    });
    const dlqRegistrations = () => registry.seen.filter((r) => r.method === "POST" && r.path === "/subjects/writ.dlq-value/versions").length;
    const owner = ownerWith({ codec: new WireCodec({ schemaRegistryUrl: registry.url }), config: { outageBackoffInitialMs: 1, outageBackoffMaxMs: 2 } });
    owner.start();
    await waitFor(() => owner.state === "running", { timeoutMs: 5_000, intervalMs: 1, message: "the owner never opened its partition" });
    owner.accept([intentRecord(0, "not JSON")], "0");
    // Asked again and again, as in an outage; the offset stays.
    await waitFor(() => dlqRegistrations() >= 5, { timeoutMs: 10_000, intervalMs: 1, message: () => `${dlqRegistrations()} registrations; offsets committed ${JSON.stringify(committed().map((t) => t.offset))}` });
    expect(committed().some((t) => t.offset === "1")).toBe(false);
    denied = false;
    await waitFor(() => committed().some((t) => t.offset === "1"), { timeoutMs: 10_000, intervalMs: 1, message: "the offset never passed" });
    const letters = committed()
      .flatMap((t) => t.records)
      .filter((r) => r.topic === "writ.dlq")
      .map((r) => JSON.parse(r.value!.subarray(5).toString("utf8")) as { reason: string; source: { offset: string } });
    expect(letters.map((d) => [d.source.offset, d.reason])).toEqual([["0", "undecodable"]]);
    await owner.close();
  });
});
