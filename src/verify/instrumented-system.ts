import { entityKey, type EntityRef } from "../schemas/common.ts";
import type { PatchOutcome, SystemOfRecord } from "../sor/adapter.ts";
import type { ProxyFaultKind } from "./fault-proxy.ts";

/** The owner's PATCH the `beforeNextPatch` hook ran before, and what the adapter made of it. */
export interface HookedPatch {
  idempotencyKey: string;
  ifMatch: string;
  outcome: PatchOutcome["kind"] | "threw";
}

/**
 * A system of record as verify hands it to its owner: the user's adapter,
 * unchanged, with two hooks at the adapter boundary.
 *
 * - `beforeNextPatch`: runs a callback after the owner read the record and
 *   before its PATCH leaves, the window where another writer's change turns
 *   into a lost update. The race scenario writes there, so the interleaving
 *   is fixed, not left to timing.
 * - `simulate`: for systems the fault proxy cannot stand in front of (not
 *   HTTP): the adapter's patch runs and commits, and the owner is told
 *   `unknown`, as after a timeout. This proves writ's reconcile path for the
 *   tool; it does not prove that the adapter itself classifies a timeout as
 *   unknown (the proxy does, for HTTP systems).
 */
export interface InstrumentedSystem extends SystemOfRecord {
  beforeNextPatch(entity: EntityRef, hook: () => Promise<void>): void;
  disarm(entity: EntityRef): void;
  /** Whether the armed `beforeNextPatch` hook has run. */
  hookFired(entity: EntityRef): boolean;
  /** The PATCH the hook ran before, once the adapter answered it. */
  hookedPatch(entity: EntityRef): HookedPatch | null;
  simulate(kind: ProxyFaultKind, idempotencyKey: string): void;
  /** Simulated faults that fired, by idempotency key. */
  simulatedFired(idempotencyKey: string): boolean;
  /** PATCHes the owner sent with this idempotency key. */
  patchCount(idempotencyKey: string): number;
  /** The versions the adapter reported `applied` at for this idempotency key, each once. */
  appliedVersions(idempotencyKey: string): string[];
}

export function instrumentSystem(inner: SystemOfRecord): InstrumentedSystem {
  const hooks = new Map<string, () => Promise<void>>();
  const firedHooks = new Set<string>();
  const hookedPatches = new Map<string, HookedPatch>();
  const simulated = new Map<string, ProxyFaultKind>();
  const firedSimulations = new Set<string>();
  const patches = new Map<string, number>();
  const applied = new Map<string, Set<string>>();

  const system: InstrumentedSystem = {
    name: inner.name,
    capabilities: inner.capabilities,
    read: (entity, opts) => inner.read(entity, opts),
    async patch(entity, ops, opts): Promise<PatchOutcome> {
      const key = entityKey(entity);
      const hook = hooks.get(key);
      if (hook !== undefined) {
        hooks.delete(key);
        // The hook reports its own failures; the owner's write goes ahead either way.
        await hook().catch(() => undefined);
        firedHooks.add(key);
      }
      patches.set(opts.idempotencyKey, (patches.get(opts.idempotencyKey) ?? 0) + 1);
      const hooked = (outcome: HookedPatch["outcome"]) => {
        if (hook !== undefined) hookedPatches.set(key, { idempotencyKey: opts.idempotencyKey, ifMatch: opts.ifMatch, outcome });
      };
      let outcome: PatchOutcome;
      try {
        outcome = await inner.patch(entity, ops, opts);
      } catch (err) {
        hooked("threw");
        throw err;
      }
      hooked(outcome.kind);
      if (outcome.kind === "applied") applied.set(opts.idempotencyKey, (applied.get(opts.idempotencyKey) ?? new Set()).add(outcome.version));
      const fault = simulated.get(opts.idempotencyKey);
      if (fault !== undefined && outcome.kind === "applied") {
        simulated.delete(opts.idempotencyKey);
        firedSimulations.add(opts.idempotencyKey);
        return { kind: "unknown", message: `writ verify: ${fault} simulated at the adapter after the write committed` };
      }
      return outcome;
    },
    beforeNextPatch: (entity, hook) => {
      firedHooks.delete(entityKey(entity));
      hookedPatches.delete(entityKey(entity));
      hooks.set(entityKey(entity), hook);
    },
    disarm: (entity) => void hooks.delete(entityKey(entity)),
    hookFired: (entity) => firedHooks.has(entityKey(entity)),
    hookedPatch: (entity) => hookedPatches.get(entityKey(entity)) ?? null,
    simulate: (kind, idempotencyKey) => void simulated.set(idempotencyKey, kind),
    simulatedFired: (idempotencyKey) => firedSimulations.has(idempotencyKey),
    patchCount: (idempotencyKey) => patches.get(idempotencyKey) ?? 0,
    appliedVersions: (idempotencyKey) => [...(applied.get(idempotencyKey) ?? [])],
  };
  if (inner.lookupIdempotencyKey) {
    const lookup = inner.lookupIdempotencyKey.bind(inner);
    system.lookupIdempotencyKey = (entity, key, opts) => lookup(entity, key, opts);
  }
  if (inner.upsertByExternalId) system.upsertByExternalId = inner.upsertByExternalId.bind(inner);
  return system;
}
