// Forward compatibility of replies: an owner newer than the agent's client may answer with a reason the client does
// not know. The client must still deliver the reply (as its status says), or the agent waits for an answer it has.
import { describe, expect, it } from "vitest";
import { WireCodec } from "../../src/codec.ts";

const base = { intentId: "i-1", intentKey: "a".repeat(64), duplicate: false, at: "2026-01-01T00:00:00.000Z" };

describe("Reply reasons are open", () => {
  it("decodes a rejected reply whose reason a newer owner added", async () => {
    const codec = new WireCodec({});
    const value = Buffer.from(JSON.stringify({ ...base, status: "rejected", reason: "reason_from_the_future", message: "m" }));
    const decoded = await codec.decode("Reply", value);
    expect(decoded.ok && decoded.value).toMatchObject({ status: "rejected", reason: "reason_from_the_future" });
  });

  it("still refuses a reason that is not a reason word (bounded, lower-case)", async () => {
    const codec = new WireCodec({});
    for (const reason of ["", "Not A Reason", "x".repeat(65), 7]) {
      const decoded = await codec.decode("Reply", Buffer.from(JSON.stringify({ ...base, status: "rejected", reason, message: "m" })));
      expect(decoded.ok, String(reason)).toBe(false);
    }
  });
});
