// Who may write writ's trusted topics. writ's trust model rests on the brokers' ACLs: only owners write the
// ledger, writ.human (escalations), writ.dlq and the reply topics; agents write only writ.intents. On a
// cluster without an authorizer, or with ACLs that let another principal write one of those topics, any
// such client can forge a ledger entry, an escalation or a reply. `writ doctor` and `writ console` both run
// this check (DescribeAcls) and say so.
//
// analyzeTopicAcls is the rule, a pure function over DescribeAcls's answer; checkTopicAcls asks the brokers.
import kafkajs, { type Admin, type DescribeAclResource } from "kafkajs";
import { WritError } from "../errors.ts";
import { printable } from "../printable.ts";

// kafkajs's ACL enums are not found by Node's named-export detection for CommonJS: take them off the module object.
const { AclOperationTypes, AclPermissionTypes, AclResourceTypes, ResourcePatternTypes } = kafkajs;

/** The owner principal `writ doctor` and `writ console` assume without `--owner-principal` / `$WRIT_OWNER_PRINCIPALS`: the README's. */
export const DEFAULT_OWNER_PRINCIPAL = "User:writ-owner";

/** Where the README tells how to restrict writers. */
export const ACL_README_SECTION = `the README's "Running with SASL/TLS and ACLs" (its ACL table)`;

/** writ's topic names (the owners' configuration). */
export interface WritTopicNames {
  intents: string;
  ledger: string;
  human: string;
  dlq: string;
  replyPrefix: string;
}

/**
 * Why the check says what it says (`reason` in `writ doctor --json` and the console's `trust`):
 * - `owners_only`: only the owner principals may write the trusted topics;
 * - `foreign_writers`: another principal (or `User:*`) may write one of them;
 * - `owners_cannot_write`: no ACL lets the owners write one of writ's topics (they write the intents topic too,
 *   forwarding and healing): they fail there unless they are super users, and a topic no ACL names at all is
 *   anyone's to write on brokers with `allow.everyone.if.no.acl.found=true`;
 * - `no_authorizer`: the cluster has no authorizer (DescribeAcls answers SECURITY_DISABLED): anyone may write anything;
 * - `acls_not_visible`: this client's principal may not describe ACLs (CLUSTER_AUTHORIZATION_FAILED);
 * - `acl_check_failed`: DescribeAcls failed otherwise (the error says how).
 */
export type AclReason = "owners_only" | "foreign_writers" | "owners_cannot_write" | "no_authorizer" | "acls_not_visible" | "acl_check_failed";

/** One ALLOW ACL that lets `principal` write (Write or All) a topic, and the resource pattern it is on. */
export interface AclWriter {
  principal: string;
  /** `*` or the one host it is allowed from. */
  host: string;
  patternType: "literal" | "prefixed";
  /** The ACL's resource name (`*` on a literal pattern: every topic). */
  resourceName: string;
  /** The principal is one of the owners. */
  owner: boolean;
}

export interface AclTopicCheck {
  /** The topic, or the reply prefix with `*` (`writ.replies.*`: any topic starting with it). */
  topic: string;
  role: "intents" | "ledger" | "human" | "dlq" | "replies";
  /** Only owners may write it (all but the intents topic, which agents write). */
  trusted: boolean;
  writers: AclWriter[];
  /** Principals other than the owners that may write it (always empty for the intents topic). */
  foreign: string[];
  /** An ACL lets an owner write it (all of it, for the reply topics). */
  ownersMayWrite: boolean;
  /**
   * No ACL of any operation or principal names it (for the reply topics: some of them): only super users may
   * write it, or anyone where the brokers set `allow.everyone.if.no.acl.found=true`, which DescribeConfigs
   * does not disclose (Kafka reports it, and `super.users`, as sensitive).
   */
  noAcl: boolean;
}

export interface AclCheck {
  /** `ok`: owners only; `warning`: anyone (no authorizer) or a foreign principal may write a trusted topic, or the owners may not write one of writ's topics; `unknown`: not checked. */
  status: "ok" | "warning" | "unknown";
  reason: AclReason;
  /** One sentence for the operator. */
  message: string;
  /** The principals taken as owners. */
  owners: string[];
  /** Per topic, with an authorizer only (empty otherwise). */
  topics: AclTopicCheck[];
  /** The brokers' error, for `acls_not_visible` and `acl_check_failed`. */
  error?: string;
}

/** Principals as Kafka writes them (`User:<name>` for a bare name), from a list of comma-separated values. Throws config_invalid on a bad one or none. */
export function ownerPrincipals(values: readonly string[], field = "--owner-principal"): string[] {
  const out = new Set<string>();
  for (const raw of values.flatMap((v) => v.split(","))) {
    const v = raw.trim();
    if (v === "") continue;
    if (!/^[^\s\x00-\x1f\x7f]+$/.test(v) || v.endsWith(":")) {
      throw new WritError("config_invalid", `${field}: not a Kafka principal (User:<name>, or a bare SASL user name): "${printable(v.slice(0, 200))}"`, { retriable: false, context: { field } });
    }
    out.add(v.includes(":") ? v : `User:${v}`);
  }
  if (out.size === 0) throw new WritError("config_invalid", `${field}: no principal given`, { retriable: false, context: { field } });
  return [...out];
}

type Entry = Omit<DescribeAclResource, "acls"> & DescribeAclResource["acls"][number];
/** Which topics an ACL's grant is about: one topic, or every topic starting with a prefix. */
type Scope = { exact: string } | { prefix: string };
type Target = { topic: string } | { prefix: string };

const literal = (e: Entry) => e.resourcePatternType === ResourcePatternTypes.LITERAL;
const prefixed = (e: Entry) => e.resourcePatternType === ResourcePatternTypes.PREFIXED;
const everyTopic = (e: Entry) => literal(e) && e.resourceName === "*";

/** The ACL's resource covers topic `name` (as the broker matches: literal name or `*`, or a prefix of it). */
function coversTopic(e: Entry, name: string): boolean {
  return literal(e) ? e.resourceName === name || e.resourceName === "*" : prefixed(e) && name.startsWith(e.resourceName);
}

/** What of `target` the ACL's resource covers, or undefined when nothing. */
function scopeWithin(e: Entry, target: Target): Scope | undefined {
  if ("topic" in target) return coversTopic(e, target.topic) ? { exact: target.topic } : undefined;
  const p = target.prefix;
  if (everyTopic(e)) return { prefix: p };
  if (literal(e)) return e.resourceName.startsWith(p) ? { exact: e.resourceName } : undefined;
  if (!prefixed(e)) return undefined;
  if (p.startsWith(e.resourceName)) return { prefix: p };
  return e.resourceName.startsWith(p) ? { prefix: e.resourceName } : undefined;
}

/** The (DENY) ACL's resource covers every topic of `scope`. */
function coversScope(e: Entry, scope: Scope): boolean {
  if ("exact" in scope) return coversTopic(e, scope.exact);
  return everyTopic(e) || (prefixed(e) && scope.prefix.startsWith(e.resourceName));
}

/** Every topic of `target` is one the ACL's resource names (any operation, principal or permission). */
function namesAll(e: Entry, target: Target): boolean {
  if ("topic" in target) return coversTopic(e, target.topic);
  return everyTopic(e) || (prefixed(e) && target.prefix.startsWith(e.resourceName));
}

const ROLE_WHAT: Record<AclTopicCheck["role"], string> = {
  intents: "intents",
  ledger: "ledger entries",
  human: "escalations",
  dlq: "dead letters",
  replies: "replies",
};

function trustedList(t: WritTopicNames): string {
  return `${t.ledger}, ${t.human}, ${t.dlq} and the reply topics (${t.replyPrefix}*)`;
}

/**
 * Who may write each of writ's topics, from DescribeAcls's answer (topic ACLs of any pattern, operation and
 * permission). An ALLOW of Write or All counts, on a literal resource naming the topic or `*`, or a prefixed
 * one the topic starts with (for the reply topics: any resource that covers some topic starting with the
 * prefix); a `User:*` principal counts as itself (everyone). A DENY of Write or All takes an ALLOW away when it
 * covers all the topics the ALLOW covers there, for the same principal (or `User:*`) and host (or `*`), as
 * the broker decides (DENY wins). Super users are not in ACLs and are not listed.
 */
export function analyzeTopicAcls(resources: readonly DescribeAclResource[], topics: WritTopicNames, owners: readonly string[]): AclCheck {
  const topicAcls = resources
    .filter((r) => r.resourceType === AclResourceTypes.TOPIC)
    .flatMap((r) => r.acls.map((a): Entry => ({ resourceType: r.resourceType, resourceName: r.resourceName, resourcePatternType: r.resourcePatternType, ...a })));
  const writes = topicAcls.filter((e) => e.operation === AclOperationTypes.WRITE || e.operation === AclOperationTypes.ALL);
  const allows = writes.filter((e) => e.permissionType === AclPermissionTypes.ALLOW && (literal(e) || prefixed(e)));
  const denies = writes.filter((e) => e.permissionType === AclPermissionTypes.DENY);
  const ownerSet = new Set(owners);

  const targets: { topic: string; role: AclTopicCheck["role"]; target: Target }[] = [
    { topic: topics.intents, role: "intents", target: { topic: topics.intents } },
    { topic: topics.ledger, role: "ledger", target: { topic: topics.ledger } },
    { topic: topics.human, role: "human", target: { topic: topics.human } },
    { topic: topics.dlq, role: "dlq", target: { topic: topics.dlq } },
    { topic: `${topics.replyPrefix}*`, role: "replies", target: { prefix: topics.replyPrefix } },
  ];
  const checked = targets.map(({ topic, role, target }): AclTopicCheck => {
    const writers = new Map<string, AclWriter>();
    for (const allow of allows) {
      const scope = scopeWithin(allow, target);
      if (scope === undefined) continue;
      const denied = denies.some(
        (d) => (d.principal === allow.principal || d.principal === "User:*") && (d.host === "*" || d.host === allow.host) && coversScope(d, scope),
      );
      if (denied) continue;
      const w: AclWriter = {
        principal: allow.principal,
        host: allow.host,
        patternType: literal(allow) ? "literal" : "prefixed",
        resourceName: allow.resourceName,
        owner: ownerSet.has(allow.principal),
      };
      writers.set(JSON.stringify([w.principal, w.host, w.patternType, w.resourceName]), w);
    }
    const list = [...writers.values()].sort((a, b) => Number(b.owner) - Number(a.owner) || a.principal.localeCompare(b.principal) || a.resourceName.localeCompare(b.resourceName));
    const trusted = role !== "intents";
    const foreign = trusted ? [...new Set(list.filter((w) => !w.owner).map((w) => w.principal))] : [];
    // For the reply topics, an owner's grant must reach all of them (a prefix of the reply prefix, or `*`).
    const ownersMayWrite = list.some((w) => w.owner && (role !== "replies" || w.resourceName === "*" || (w.patternType === "prefixed" && topics.replyPrefix.startsWith(w.resourceName))));
    const noAcl = !topicAcls.some((e) => namesAll(e, target));
    return { topic, role, trusted, writers: list, foreign, ownersMayWrite, noAcl };
  });

  const flagged = checked.filter((t) => t.foreign.length > 0);
  const ownerText = owners.length === 0 ? "none given" : owners.join(", ");
  const unwritable = checked.filter((t) => !t.ownersMayWrite);
  if (flagged.length === 0 && unwritable.length > 0) {
    const unnamed = unwritable.filter((t) => t.noAcl).map((t) => t.topic);
    return {
      status: "warning",
      reason: "owners_cannot_write",
      message:
        `no ACL lets the owners (${ownerText}) write ${unwritable.map((t) => `${t.topic} (${ROLE_WHAT[t.role]})`).join(", ")}: ` +
        `they fail there unless they are super users (which ACLs do not list)` +
        (unnamed.length === 0
          ? ""
          : `; no ACL names ${unnamed.join(", ")} at all, so on brokers with allow.everyone.if.no.acl.found=true (which they do not disclose) any client may write it`) +
        `. Add the owners' ACLs of ${ACL_README_SECTION}, or name the owners' principal with --owner-principal / WRIT_OWNER_PRINCIPALS`,
      owners: [...owners],
      topics: checked,
    };
  }
  if (flagged.length === 0) {
    return {
      status: "ok",
      reason: "owners_only",
      message: `only the owners (${ownerText}) may write ${trustedList(topics)}, besides super users (which ACLs do not list)`,
      owners: [...owners],
      topics: checked,
    };
  }
  const who = flagged.map((t) => `${t.foreign.join(", ")} may write ${t.topic} (${ROLE_WHAT[t.role]})`).join("; ");
  return {
    status: "warning",
    reason: "foreign_writers",
    message:
      `principals other than the owners (${ownerText}) may write trusted topics: ${who}; such a client can forge what they hold. ` +
      `Remove those ACLs (kafka-acls.sh --remove), or name the principal with --owner-principal / WRIT_OWNER_PRINCIPALS if it is an owner; see ${ACL_README_SECTION}`,
    owners: [...owners],
    topics: checked,
  };
}

/** The check's answer when DescribeAcls fails: no authorizer, a principal that may not describe ACLs, or another error. */
export function aclCheckFailure(err: unknown, topics: WritTopicNames, owners: readonly string[]): AclCheck {
  const e = err as { type?: unknown; message?: unknown } | null;
  const type = typeof e?.type === "string" ? e.type : undefined;
  const detail = type ?? (typeof e?.message === "string" ? e.message : String(err));
  const answer = (status: AclCheck["status"], reason: AclReason, message: string, error?: string): AclCheck => ({
    status,
    reason,
    message,
    owners: [...owners],
    topics: [],
    ...(error === undefined ? {} : { error }),
  });
  const trusted = trustedList(topics);
  if (type === "SECURITY_DISABLED") {
    return answer(
      "warning",
      "no_authorizer",
      `the cluster has no authorizer (DescribeAcls answers SECURITY_DISABLED): any client can write ${trusted}, ` +
        `so forge ledger entries, escalations and replies; set authorizer.class.name and the ACLs of ${ACL_README_SECTION}`,
    );
  }
  if (type === "CLUSTER_AUTHORIZATION_FAILED") {
    const why = "CLUSTER_AUTHORIZATION_FAILED: DescribeAcls needs Describe on the cluster";
    return answer(
      "unknown",
      "acls_not_visible",
      `this principal may not describe ACLs (${why}), so who may write ${trusted} was not checked; run as a principal that may (a super user, or one with Describe on the cluster)`,
      detail,
    );
  }
  return answer("unknown", "acl_check_failed", `could not read the cluster's ACLs (${detail}), so who may write ${trusted} was not checked`, detail);
}

/**
 * Asks the brokers for every topic ACL (DescribeAcls: any pattern, operation and permission) and analyzes
 * them; never throws: a failure is the check's answer (`no_authorizer`, `acls_not_visible`, `acl_check_failed`).
 */
export async function checkTopicAcls(admin: Pick<Admin, "describeAcls">, topics: WritTopicNames, owners: readonly string[]): Promise<AclCheck> {
  try {
    const { resources } = await admin.describeAcls({
      resourceType: AclResourceTypes.TOPIC,
      resourcePatternType: ResourcePatternTypes.ANY,
      operation: AclOperationTypes.ANY,
      permissionType: AclPermissionTypes.ANY,
    });
    return analyzeTopicAcls(resources, topics, owners);
  } catch (err) {
    return aclCheckFailure(err, topics, owners);
  }
}

/** The check as text lines: one per topic's writers (with an authorizer), then the verdict. */
export function formatAclCheck(check: AclCheck): string[] {
  const lines: string[] = [];
  for (const t of check.topics) {
    const writers = t.writers.map((w) => `${w.principal}${w.host === "*" ? "" : `@${w.host}`} (${w.patternType} ${w.resourceName})${t.trusted && !w.owner ? " NOT AN OWNER" : ""}`);
    const none = t.noAcl ? "no ACL names it (super users only; anyone if allow.everyone.if.no.acl.found=true)" : "no ACL allows Write (super users only)";
    lines.push(`ACL ${t.topic}${t.trusted ? "" : " (agents write it)"}: ${writers.length === 0 ? none : `Write allowed to ${writers.join(", ")}`}${t.ownersMayWrite ? "" : " OWNERS MAY NOT WRITE"}`);
  }
  const label = check.status === "ok" ? "ACLS OK" : check.status === "warning" ? "ACL WARNING" : "ACLS NOT CHECKED";
  lines.push(`${label} (${check.reason}): ${check.message}`);
  return lines;
}
