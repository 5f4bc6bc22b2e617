// VersionBook: bounded, least recently used dropped first; what it still holds reads as before.
import { describe, expect, it } from "vitest";
import { DEFAULT_VERSION_BOOK_SIZE, VersionBook } from "../../producers/adapters/tool-bridge.ts";

const ref = (id: string) => ({ type: "ticket", id });
const rec = (id: string, v = 1) => ({ state: { id, v }, version: `"v${v}"` });

describe("VersionBook", () => {
  it("keeps at most maxEntries, dropping the least recently used (a get counts as use)", () => {
    const book = new VersionBook({ maxEntries: 3 });
    for (const id of ["a", "b", "c"]) book.remember(ref(id), rec(id));
    expect(book.get(ref("a"))).toEqual(rec("a"));
    book.remember(ref("d"), rec("d"));

    expect(book.get(ref("b"))).toBeUndefined();
    expect(book.get(ref("a"))).toEqual(rec("a"));
    expect(book.get(ref("c"))).toEqual(rec("c"));
    expect(book.get(ref("d"))).toEqual(rec("d"));
  });

  it("remembering a known entity replaces it (state and version) without dropping another", () => {
    const book = new VersionBook({ maxEntries: 2 });
    book.remember(ref("a"), rec("a"));
    book.remember(ref("b"), rec("b"));
    book.remember(ref("a"), rec("a", 2));

    expect(book.get(ref("a"))).toEqual(rec("a", 2));
    expect(book.get(ref("b"))).toEqual(rec("b"));
    book.remember(ref("c"), rec("c"));
    expect(book.get(ref("a"))).toBeUndefined();
    expect(book.get(ref("b"))).toEqual(rec("b"));
  });

  it(`is bounded by default (${DEFAULT_VERSION_BOOK_SIZE} entities)`, () => {
    const book = new VersionBook();
    for (let i = 0; i <= DEFAULT_VERSION_BOOK_SIZE; i++) book.remember(ref(`t${i}`), rec(`t${i}`));

    expect(book.get(ref("t0"))).toBeUndefined();
    expect(book.get(ref("t1"))).toEqual(rec("t1"));
    expect(book.get(ref(`t${DEFAULT_VERSION_BOOK_SIZE}`))).toEqual(rec(`t${DEFAULT_VERSION_BOOK_SIZE}`));
  });

  it("refuses a bound that is not a positive integer", () => {
    expect(() => new VersionBook({ maxEntries: 0 })).toThrow(/maxEntries/);
    expect(() => new VersionBook({ maxEntries: 1.5 })).toThrow(/maxEntries/);
  });
});
