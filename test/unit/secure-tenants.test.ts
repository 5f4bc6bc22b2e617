// The secure stack's tenants (src/testing/secure-stack.ts): suites that share one stack must not see each other's
// users, topics or groups. Checked on the ACL rules the stack makes at start, without a broker: the ACL check of
// `writ doctor` (src/doctor/acls.ts) over all of them finds, for each tenant's names, its own owner alone on the
// trusted topics and its own agents alone besides on its intents topic; no rule of one tenant's users names a
// resource of another's (or the README's names, which the stack's own users and test/integration/doctor-acls.test.ts
// keep).
import kafkajs, { type DescribeAclResource } from "kafkajs";
import { describe, expect, it } from "vitest";
import { analyzeTopicAcls } from "../../src/doctor/acls.ts";
import { SECURE_AGENTS, secureStackAclRules, secureTenantNames, type AclRule } from "../../src/testing/secure-stack.ts";
import { SECURE_TENANTS } from "../helpers/secure-tenants.ts";

const { AclOperationTypes, AclPermissionTypes, AclResourceTypes, ResourcePatternTypes } = kafkajs;
const TENANTS = Object.values(SECURE_TENANTS);

/** DescribeAcls's answer for these rules, grouped by resource as the broker groups them. */
function described(rules: AclRule[]): DescribeAclResource[] {
  const byResource = new Map<string, DescribeAclResource>();
  for (const r of rules) {
    const k = `${r.resourceType}/${r.patternType}/${r.resourceName}`;
    const resource = byResource.get(k) ?? { resourceType: AclResourceTypes[r.resourceType], resourceName: r.resourceName, resourcePatternType: ResourcePatternTypes[r.patternType], acls: [] };
    for (const op of r.operations) resource.acls.push({ principal: r.principal, host: "*", operation: AclOperationTypes[op], permissionType: AclPermissionTypes.ALLOW });
    byResource.set(k, resource);
  }
  return [...byResource.values()];
}

const rules = secureStackAclRules(TENANTS);

describe("the secure stack's tenants", () => {
  it.each(["", ...TENANTS])("tenant %j: the ACL check over every tenant's ACLs finds only its owner on its trusted topics and its agents on its intents topic", (tenant) => {
    const n = secureTenantNames(tenant);
    const owner = `User:${n.users["writ-owner"]}`;
    const check = analyzeTopicAcls(described(rules), { ...n.topics, replyPrefix: n.replyPrefix }, [owner]);
    expect(check).toMatchObject({ status: "ok", reason: "owners_only" });
    const writers = Object.fromEntries(check.topics.map((t) => [t.topic, t.writers.map((w) => w.principal)]));
    expect(writers).toEqual({
      [n.topics.intents]: [owner, ...SECURE_AGENTS.map((a) => `User:${n.users[a]}`)],
      [n.topics.ledger]: [owner],
      [n.topics.human]: [owner],
      [n.topics.dlq]: [owner],
      [`${n.replyPrefix}*`]: [owner],
    });
  });

  it("no rule of a tenant's users names another tenant's resources or the README's names; each tenant's users are its own", () => {
    const mine = (tenant: string) => {
      const n = secureTenantNames(tenant);
      const users = new Set((["writ-owner", ...SECURE_AGENTS] as const).map((role) => `User:${n.users[role]}`));
      return { users, rules: rules.filter((r) => users.has(r.principal)) };
    };
    const all = ["", ...TENANTS].map(mine);
    // every user belongs to one tenant (the stack's own included)
    const users = all.flatMap((t) => [...t.users]);
    expect(new Set(users).size).toBe(users.length);
    for (const tenant of TENANTS) {
      const { users: own, rules: its } = mine(tenant);
      expect(its.length).toBeGreaterThan(0);
      for (const r of its) {
        // its topics, groups and transactional ids under `<tenant>.`, or its agents' reply-consumer groups
        const agentGroup = r.resourceType === "GROUP" && [...own].some((u) => r.resourceName === `writ.client.${u.slice("User:".length)}.`);
        expect(r.resourceName.startsWith(`${tenant}.`) || agentGroup, JSON.stringify(r)).toBe(true);
      }
    }
    // and every rule is someone's
    expect(all.reduce((k, t) => k + t.rules.length, 0)).toBe(rules.length);
  });

  it("tenant names: what is not a plain name is refused before anything starts", () => {
    for (const bad of [" ", "Upper", "1st", "a.b", "a_b", "x".repeat(33)]) expect(() => secureTenantNames(bad)).toThrow(/secure stack tenant/);
    expect(secureTenantNames("t-1").users).toEqual({ admin: "admin", "writ-owner": "t-1-writ-owner", "agent-a": "t-1-agent-a", "agent-b": "t-1-agent-b" });
  });
});
