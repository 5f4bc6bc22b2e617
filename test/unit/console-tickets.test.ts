import { describe, expect, it } from "vitest";
import { StreamTickets } from "../../src/console/auth.ts";

describe("the console's stream tickets", () => {
  it("a ticket gives its token's role once, within its lifetime; an unknown, used or expired one gives nothing", () => {
    let now = 1_000_000;
    const tickets = new StreamTickets({ ttlMs: 30_000, now: () => now });
    const reader = tickets.issue("reader")!;
    const operator = tickets.issue("operator")!;
    expect(reader).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(operator).not.toBe(reader);
    expect(tickets.redeem(operator)).toBe("operator");
    expect(tickets.redeem(operator)).toBeNull();
    expect(tickets.redeem("not-a-ticket")).toBeNull();
    expect(tickets.redeem(null)).toBeNull();
    expect(tickets.redeem("x".repeat(10_000))).toBeNull();
    now += 30_000;
    expect(tickets.redeem(reader)).toBeNull();
  });

  it("refuses a new ticket with `max` outstanding, rather than evicting another page's; expired ones make room", () => {
    let now = 0;
    const tickets = new StreamTickets({ ttlMs: 1_000, max: 3, now: () => now });
    const first = [tickets.issue("reader"), tickets.issue("reader"), tickets.issue("reader")];
    expect(first.every((t) => t !== null)).toBe(true);
    expect(tickets.issue("operator")).toBeNull();
    expect(tickets.redeem(first[0]!)).toBe("reader");
    expect(tickets.issue("operator")).not.toBeNull();
    now += 1_000;
    expect(tickets.issue("reader")).not.toBeNull();
    expect(tickets.redeem(first[1]!)).toBeNull();
  });
});
