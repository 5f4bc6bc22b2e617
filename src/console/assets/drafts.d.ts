// Types of drafts.js (the page's plain JavaScript, no build step), for its unit test.
import type { EscalationItem } from "../view.ts";

export interface CardFields {
  base: string;
  delta: string;
  use: boolean;
  message: string;
  open: boolean;
}

export interface Draft {
  message?: string;
  open?: boolean;
  pinned?: { base: string; delta: string; use: boolean; basis: string };
}

export declare const decidable: (e: EscalationItem) => boolean;
export declare function prefill(e: EscalationItem): CardFields;
/** The base version an Apply sends for what the base field holds: the record's own when it is the one shown, else it trimmed. */
export declare const baseToSend: (e: EscalationItem | undefined, base: string) => string;

export declare class DraftBook {
  get(id: string): Draft | undefined;
  fields(e: EscalationItem): CardFields;
  edit<K extends keyof CardFields>(e: EscalationItem, field: K, value: CardFields[K]): void;
  stale(e: EscalationItem): { was: string; now: string } | null;
  keep(e: EscalationItem): void;
  reset(e: EscalationItem): void;
  prune(list: EscalationItem[]): void;
}
