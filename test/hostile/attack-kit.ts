// Shared pieces of the hand-written attacks: the Attack shape and the helpers that build and send
// attack records (each noted in the Book before it is sent).
import type { Ent, Out, World } from "./world.ts";
import { type Agent, type Json, SIGNATURE_HEADER } from "./wire.ts";

export interface Attack {
  /** Group for the report (e.g. "spoofed agent"). */
  kind: string;
  label: string;
  on: "payment" | "ticket";
  /** What a correct owner does with it (for the outcome table; the pass/fail measures are the suite's figures). */
  expect: string;
  send(w: World, e: Ent): Promise<void>;
}

export const clone = (v: Json): Json => structuredClone(v);
/** One attack record keyed like its record unless told otherwise. */
export const bad = (label: string, e: Ent, value: Buffer | null, extra: Partial<Out> = {}): Out => ({ role: "attack", label, key: e.key, value, ...extra });
export const one = (w: World, o: Out) => w.send([o]);
export const json = (w: World, v: unknown) => w.framed(JSON.stringify(v));
/** Signed as `signer` over `signedValue`, sent as `sentValue` (tampering after signing). */
export const signedAs = (w: World, label: string, e: Ent, signedValue: Json, sentValue: Json, signer: Agent, extra: Partial<Out> = {}) =>
  one(w, bad(label, e, json(w, sentValue), { headers: w.sig(signedValue, signer), ...extra }));
/** Signed genuinely (over exactly what is sent) by `agent`. */
export const genuine = (w: World, label: string, e: Ent, v: Json, agent: Agent, extra: Partial<Out> = {}) => signedAs(w, label, e, v, v, agent, extra);
export const deep = (n: number) => "[".repeat(n) + "]".repeat(n);
export const deepObj = (n: number) => '{"a":'.repeat(n) + "0" + "}".repeat(n);
/** Raw JSON text with `marker` (a JSON string in `v`) replaced by `raw` bytes. */
export const splice = (v: Json, marker: string, raw: Buffer): Buffer => {
  const text = JSON.stringify(v);
  const at = text.indexOf(marker);
  return Buffer.concat([Buffer.from(text.slice(0, at)), raw, Buffer.from(text.slice(at + marker.length))]);
};
export const hdr = (w: World, v: unknown, a: Agent): string => (w.sig(v, a)[SIGNATURE_HEADER] as string);

export function a(kind: string, label: string, on: Attack["on"], expect: string, send: Attack["send"]): Attack {
  return { kind, label, on, expect, send };
}

