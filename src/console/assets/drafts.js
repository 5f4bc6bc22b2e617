// writ console: what the operator typed on escalation cards and has not sent, kept by escalation id apart from
// the cards (src/console/assets/console.js). A card may be built again at any time (a filter hides and shows
// it, the page's role changes), and its fields are then filled from here, not from the escalation's prefill.
// A draft lives while its escalation is listed and decidable from the page, and belongs to that escalation
// only. No DOM here: the unit test (test/unit/console-drafts.test.ts) runs it in Node.

/**
 * Whether the page offers the decisions: open, or closed only as a reply reported it (any producer can write a
 * reply topic: the owner decides, and answers resolution_not_applicable when it is closed). Never when contested.
 */
export const decidable = (e) => !e.contested && (e.status === "open" || Boolean(e.resolution && e.resolution.from === "reply"));

/** The version of the record the card shows for escalation `e` ("" when the owner could not read it). */
const shownVersion = (e) => (e.current ? e.current.version : "");

/**
 * What the page sends as the base version of an Apply whose base field holds `base`: the record's own version when
 * `base` is the one shown for it (shown escaped or cut, `rawVersion` is the version itself: the text shown would
 * never match the record, and the owner would answer resolution_conflict for ever; a version may also begin or end
 * with a space, which trimming would change), else `base` as typed, trimmed.
 */
export const baseToSend = (e, base) => (e && e.current && base === e.current.version ? (e.current.rawVersion ?? base) : base.trim());

/** The fields of `e`'s card as the page fills them before anyone types: the record's version, the agent's change. */
export function prefill(e) {
  return { base: shownVersion(e), delta: e.change && !e.change.truncated ? e.change.json : "", use: false, message: "", open: false };
}

/** The fields that go with the record shown: typing in one keeps all three as they are, with the version shown then. */
const PINNED = ["base", "delta", "use"];
const FIELDS = [...PINNED, "message", "open"];

export class DraftBook {
  constructor() {
    /** escalation id → {message?, open?, pinned?: {base, delta, use, basis}} */
    this.drafts = new Map();
  }

  /** The draft of escalation `id`, if the operator typed on its card. */
  get(id) {
    return this.drafts.get(id);
  }

  /** What `e`'s card shows: the operator's draft over the prefill (the base version following the record shown until typed in). */
  fields(e) {
    const d = this.drafts.get(e.escalationId);
    const out = prefill(e);
    if (!d) return out;
    if (d.pinned) for (const k of PINNED) out[k] = d.pinned[k];
    if (d.message !== undefined) out.message = d.message;
    if (d.open !== undefined) out.open = d.open;
    return out;
  }

  /**
   * The operator set `field` (base, delta, use, message, open) of `e`'s card to `value`. The first change to base,
   * delta or use pins those three as the card shows them, with the version of the record shown (`basis`): what
   * the change was written against.
   */
  edit(e, field, value) {
    if (!FIELDS.includes(field)) throw new Error(`no such field: ${field}`);
    const id = e.escalationId;
    const d = this.drafts.get(id) ?? {};
    if (PINNED.includes(field)) {
      if (!d.pinned) {
        const shown = this.fields(e);
        d.pinned = { base: shown.base, delta: shown.delta, use: shown.use, basis: shownVersion(e) };
      }
      d.pinned[field] = value;
    } else {
      d[field] = value;
    }
    this.drafts.set(id, d);
  }

  /**
   * When the record `e` shows is not the one its pinned change was written against: {was, now} (the card marks it,
   * and Apply waits for keep or reset); else null.
   */
  stale(e) {
    const d = this.drafts.get(e.escalationId);
    if (!d || !d.pinned || d.pinned.basis === shownVersion(e)) return null;
    return { was: d.pinned.basis, now: shownVersion(e) };
  }

  /** The operator checked the change against the record shown now: kept, to apply on that version. */
  keep(e) {
    const d = this.drafts.get(e.escalationId);
    if (!d || !d.pinned) return;
    d.pinned.basis = shownVersion(e);
    if (e.current) d.pinned.base = e.current.version;
  }

  /** The operator starts again from the record shown now: the change and base version go back to the prefill (the message stays). */
  reset(e) {
    const d = this.drafts.get(e.escalationId);
    if (!d) return;
    delete d.pinned;
    if (d.message === undefined && d.open === undefined) this.drafts.delete(e.escalationId);
  }

  /** Drops the drafts of escalations no longer in `list` (the whole list, not the filtered one) or no longer decidable. */
  prune(list) {
    const live = new Set(list.filter(decidable).map((e) => e.escalationId));
    for (const id of this.drafts.keys()) if (!live.has(id)) this.drafts.delete(id);
  }
}
