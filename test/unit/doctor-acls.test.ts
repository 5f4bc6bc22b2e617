// The ACL check of `writ doctor` and `writ console` (src/doctor/acls.ts): who may write writ's trusted topics,
// from DescribeAcls's answer, without a broker.
import kafkajs, { type DescribeAclResource } from "kafkajs";
import { afterEach, describe, expect, it } from "vitest";
import { ownerPrincipalsFrom } from "../../src/cli/common.ts";
import { aclCheckFailure, analyzeTopicAcls, checkTopicAcls, formatAclCheck, ownerPrincipals, type AclCheck } from "../../src/doctor/acls.ts";
import { WritError } from "../../src/errors.ts";

const { AclOperationTypes: Op, AclPermissionTypes: Perm, AclResourceTypes: Res, ResourcePatternTypes: Pat } = kafkajs;

const TOPICS = { intents: "writ.intents", ledger: "writ.ledger", human: "writ.human", dlq: "writ.dlq", replyPrefix: "writ.replies." };
const OWNERS = ["User:writ-owner"];

type Rule = { principal: string; name: string; pattern?: "LITERAL" | "PREFIXED"; op?: "WRITE" | "ALL" | "READ" | "DESCRIBE" | "CREATE"; deny?: boolean; host?: string; type?: "TOPIC" | "GROUP" };

/** DescribeAcls's answer for these rules, grouped by resource as the broker groups them. */
function described(...rules: Rule[]): DescribeAclResource[] {
  const byResource = new Map<string, DescribeAclResource>();
  for (const r of rules) {
    const resourceType = Res[r.type ?? "TOPIC"];
    const resourcePatternType = Pat[r.pattern ?? "LITERAL"];
    const k = `${resourceType}/${resourcePatternType}/${r.name}`;
    const resource = byResource.get(k) ?? { resourceType, resourceName: r.name, resourcePatternType, acls: [] };
    resource.acls.push({ principal: r.principal, host: r.host ?? "*", operation: Op[r.op ?? "WRITE"], permissionType: r.deny ? Perm.DENY : Perm.ALLOW });
    byResource.set(k, resource);
  }
  return [...byResource.values()];
}

/** The README's ACLs (secureStackAcls): topic rules of the owner and two agents. */
const README = [
  ...["writ.intents", "writ.ledger", "writ.human", "writ.dlq"].flatMap((name): Rule[] => [
    { principal: "User:writ-owner", name, op: "WRITE" },
    { principal: "User:writ-owner", name, op: "DESCRIBE" },
    { principal: "User:writ-owner", name, op: "CREATE" },
  ]),
  { principal: "User:writ-owner", name: "writ.ledger", op: "READ" },
  { principal: "User:writ-owner", name: "writ.replies.", pattern: "PREFIXED", op: "WRITE" },
  ...["agent-a", "agent-b"].flatMap((a): Rule[] => [
    { principal: `User:${a}`, name: "writ.intents", op: "WRITE" },
    { principal: `User:${a}`, name: `writ.replies.${a}`, pattern: "PREFIXED", op: "CREATE" },
    { principal: `User:${a}`, name: `writ.replies.${a}`, pattern: "PREFIXED", op: "READ" },
    { principal: `User:${a}`, name: `writ.client.${a}.`, pattern: "PREFIXED", op: "READ", type: "GROUP" },
  ]),
] satisfies Rule[];

const analyze = (...rules: Rule[]) => analyzeTopicAcls(described(...README, ...rules), TOPICS, OWNERS);
const byTopic = (check: AclCheck) => Object.fromEntries(check.topics.map((t) => [t.topic, t]));
const foreign = (check: AclCheck) => Object.fromEntries(check.topics.filter((t) => t.foreign.length > 0).map((t) => [t.topic, t.foreign]));

describe("the ACL check's rule (analyzeTopicAcls)", () => {
  it("the README's ACLs: only the owner writes the trusted topics; agents' Write on writ.intents is listed, not flagged", () => {
    const check = analyze();
    expect(check).toMatchObject({ status: "ok", reason: "owners_only", owners: OWNERS });
    expect(foreign(check)).toEqual({});
    const t = byTopic(check);
    for (const name of ["writ.ledger", "writ.human", "writ.dlq", "writ.replies.*"]) {
      expect(t[name]!.writers.map((w) => [w.principal, w.patternType, w.resourceName, w.owner])).toEqual([
        ["User:writ-owner", name === "writ.replies.*" ? "prefixed" : "literal", name === "writ.replies.*" ? "writ.replies." : name, true],
      ]);
    }
    // Read, Create and Describe are not Write; group ACLs are not topic ACLs
    expect(t["writ.intents"]).toMatchObject({ trusted: false, foreign: [] });
    expect(t["writ.intents"]!.writers.map((w) => w.principal)).toEqual(["User:writ-owner", "User:agent-a", "User:agent-b"]);
    expect(formatAclCheck(check).at(-1)).toMatch(/^ACLS OK \(owners_only\): only the owners \(User:writ-owner\) may write writ.ledger, writ.human, writ.dlq and the reply topics/);
  });

  it("a literal ACL naming a trusted topic, or All instead of Write, names the principal", () => {
    const check = analyze({ principal: "User:agent-a", name: "writ.human" }, { principal: "User:agent-b", name: "writ.ledger", op: "ALL" });
    expect(check).toMatchObject({ status: "warning", reason: "foreign_writers" });
    expect(foreign(check)).toEqual({ "writ.human": ["User:agent-a"], "writ.ledger": ["User:agent-b"] });
    expect(check.message).toContain("User:agent-a may write writ.human (escalations)");
    expect(check.message).toContain("User:agent-b may write writ.ledger (ledger entries)");
    expect(formatAclCheck(check)).toContain("ACL writ.human: Write allowed to User:writ-owner (literal writ.human), User:agent-a (literal writ.human) NOT AN OWNER");
  });

  it("prefixed ACLs: one the topic starts with counts, one it does not start with does not", () => {
    expect(foreign(analyze({ principal: "User:agent-a", name: "writ.", pattern: "PREFIXED" }))).toEqual({
      "writ.ledger": ["User:agent-a"],
      "writ.human": ["User:agent-a"],
      "writ.dlq": ["User:agent-a"],
      "writ.replies.*": ["User:agent-a"],
    });
    expect(foreign(analyze({ principal: "User:agent-a", name: "writ.led", pattern: "PREFIXED" }))).toEqual({ "writ.ledger": ["User:agent-a"] });
    expect(foreign(analyze({ principal: "User:agent-a", name: "writ.ledger.", pattern: "PREFIXED" }))).toEqual({});
    expect(foreign(analyze({ principal: "User:agent-a", name: "other.", pattern: "PREFIXED" }))).toEqual({});
  });

  it("reply topics: a literal or prefixed ACL on any topic with the reply prefix counts (agent-a writing agent-b's replies)", () => {
    expect(foreign(analyze({ principal: "User:agent-a", name: "writ.replies.agent-b" }))).toEqual({ "writ.replies.*": ["User:agent-a"] });
    expect(foreign(analyze({ principal: "User:agent-a", name: "writ.replies.agent-", pattern: "PREFIXED" }))).toEqual({ "writ.replies.*": ["User:agent-a"] });
    expect(foreign(analyze({ principal: "User:agent-a", name: "writ.repl", pattern: "PREFIXED" }))).toEqual({ "writ.replies.*": ["User:agent-a"] });
    // a literal topic that only shares the beginning of the prefix is not a reply topic
    expect(foreign(analyze({ principal: "User:agent-a", name: "writ.replies" }))).toEqual({});
  });

  it("the wildcards: a literal `*` resource covers every topic, a `User:*` principal is everyone", () => {
    const star = analyze({ principal: "User:agent-a", name: "*" });
    expect(foreign(star)).toEqual({ "writ.ledger": ["User:agent-a"], "writ.human": ["User:agent-a"], "writ.dlq": ["User:agent-a"], "writ.replies.*": ["User:agent-a"] });
    const everyone = analyze({ principal: "User:*", name: "writ.dlq" });
    expect(foreign(everyone)).toEqual({ "writ.dlq": ["User:*"] });
    // the owner allowed on every topic is still only the owner
    expect(analyze({ principal: "User:writ-owner", name: "*", op: "ALL" }).reason).toBe("owners_only");
    // (a prefixed `*` is a topic prefix like any other: Kafka's wildcard is the literal one)
    expect(foreign(analyze({ principal: "User:agent-a", name: "*", pattern: "PREFIXED" }))).toEqual({});
  });

  it("DENY wins over ALLOW for the principal (or User:*) and host it names, where it covers all the ALLOW covers", () => {
    // denied outright
    expect(analyze({ principal: "User:agent-a", name: "writ.human" }, { principal: "User:agent-a", name: "writ.human", deny: true }).reason).toBe("owners_only");
    // a DENY of All, on a prefix, for everyone: agent-a's grant is gone, and so is the owner's
    const everyone = analyze({ principal: "User:agent-a", name: "writ.human" }, { principal: "User:*", name: "writ.h", pattern: "PREFIXED", op: "ALL", deny: true });
    expect(foreign(everyone)).toEqual({});
    expect(everyone.reason).toBe("owners_cannot_write");
    expect(everyone.message).toMatch(/^no ACL lets the owners \(User:writ-owner\) write writ.human \(escalations\): they fail there unless they are super users/);
    // a DENY for another principal, for one host, or of Read only, takes nothing away
    expect(foreign(analyze({ principal: "User:agent-a", name: "writ.human" }, { principal: "User:agent-b", name: "writ.human", deny: true }))).toEqual({ "writ.human": ["User:agent-a"] });
    expect(foreign(analyze({ principal: "User:agent-a", name: "writ.human" }, { principal: "User:agent-a", name: "writ.human", deny: true, host: "10.0.0.9" }))).toEqual({ "writ.human": ["User:agent-a"] });
    expect(foreign(analyze({ principal: "User:agent-a", name: "writ.human" }, { principal: "User:agent-a", name: "writ.human", op: "READ", deny: true }))).toEqual({ "writ.human": ["User:agent-a"] });
    // denying User:agent-a leaves User:* (everyone else)
    expect(foreign(analyze({ principal: "User:*", name: "writ.human" }, { principal: "User:agent-a", name: "writ.human", deny: true }))).toEqual({ "writ.human": ["User:*"] });
    // reply topics: a DENY on one reply topic leaves an ALLOW on all of them; a DENY on the whole prefix does not
    expect(foreign(analyze({ principal: "User:agent-a", name: "writ.replies.", pattern: "PREFIXED" }, { principal: "User:agent-a", name: "writ.replies.agent-b", deny: true }))).toEqual({
      "writ.replies.*": ["User:agent-a"],
    });
    expect(analyze({ principal: "User:agent-a", name: "writ.replies.agent-b" }, { principal: "User:agent-a", name: "writ.replies.", pattern: "PREFIXED", deny: true }).reason).toBe("owners_only");
    // a host-bound ALLOW is listed with its host
    const hosted = analyze({ principal: "User:agent-a", name: "writ.dlq", host: "10.0.0.9" });
    expect(byTopic(hosted)["writ.dlq"]!.writers.find((w) => !w.owner)).toMatchObject({ principal: "User:agent-a", host: "10.0.0.9" });
    expect(formatAclCheck(hosted)).toContain("ACL writ.dlq: Write allowed to User:writ-owner (literal writ.dlq), User:agent-a@10.0.0.9 (literal writ.dlq) NOT AN OWNER");
  });

  it("the owner principals decide who is foreign: several owners, another owner name", () => {
    const acls = described(...README);
    expect(analyzeTopicAcls(acls, TOPICS, ["User:prod-owner"])).toMatchObject({ reason: "foreign_writers", owners: ["User:prod-owner"] });
    expect(foreign(analyzeTopicAcls(acls, TOPICS, ["User:prod-owner"]))["writ.ledger"]).toEqual(["User:writ-owner"]);
    const two = described(...README, { principal: "User:owner-2", name: "writ.ledger" });
    expect(analyzeTopicAcls(two, TOPICS, ["User:writ-owner", "User:owner-2"]).reason).toBe("owners_only");
    // other topic names (the owners' WRIT_*_TOPIC, WRIT_REPLY_TOPIC_PREFIX)
    const renamed = { intents: "a.in", ledger: "a.ledger", human: "a.human", dlq: "a.dlq", replyPrefix: "a.rep." };
    const check = analyzeTopicAcls(described({ principal: "User:agent-a", name: "a.rep.x" }, { principal: "User:agent-a", name: "writ.ledger" }), renamed, OWNERS);
    expect(foreign(check)).toEqual({ "a.rep.*": ["User:agent-a"] });
    expect(byTopic(check)["a.ledger"]!.writers).toEqual([]);
    expect(formatAclCheck(check)).toContain("ACL a.ledger: no ACL names it (super users only; anyone if allow.everyone.if.no.acl.found=true) OWNERS MAY NOT WRITE");
  });

  it("owners_cannot_write: a topic of writ's no ACL lets the owners write (foreign writers still come first)", () => {
    // the README's ACLs without the owner's Write on writ.dlq (its Describe and Create stay: the topic is named)
    const noDlqWrite = README.filter((r) => !(r.name === "writ.dlq" && r.op === "WRITE" && r.principal === "User:writ-owner"));
    const check = analyzeTopicAcls(described(...noDlqWrite), TOPICS, OWNERS);
    expect(check).toMatchObject({ status: "warning", reason: "owners_cannot_write" });
    expect(check.topics.filter((t) => !t.ownersMayWrite).map((t) => [t.topic, t.noAcl])).toEqual([["writ.dlq", false]]);
    expect(check.message).toContain("write writ.dlq (dead letters): they fail there unless they are super users");
    expect(check.message).not.toContain("allow.everyone.if.no.acl.found");
    expect(formatAclCheck(check)).toContain("ACL writ.dlq: no ACL allows Write (super users only) OWNERS MAY NOT WRITE");
    // the intents topic too: owners write it when they forward an intent or heal a partition
    const noIntentsWrite = README.filter((r) => !(r.name === "writ.intents" && r.op === "WRITE" && r.principal === "User:writ-owner"));
    expect(analyzeTopicAcls(described(...noIntentsWrite), TOPICS, OWNERS).message).toContain("write writ.intents (intents)");
    // a topic no ACL names at all: anyone's where allow.everyone.if.no.acl.found=true, which brokers do not disclose
    const unnamed = analyzeTopicAcls(described(...README), { ...TOPICS, dlq: "writ.dlq.eu" }, OWNERS);
    expect(unnamed.reason).toBe("owners_cannot_write");
    expect(unnamed.topics.find((t) => t.topic === "writ.dlq.eu")).toMatchObject({ ownersMayWrite: false, noAcl: true, writers: [] });
    expect(unnamed.message).toContain("no ACL names writ.dlq.eu at all, so on brokers with allow.everyone.if.no.acl.found=true (which they do not disclose) any client may write it");
    // reply topics: an owner's grant on some of them is not on all of them
    const someReplies = README.filter((r) => r.name !== "writ.replies.").concat([{ principal: "User:writ-owner", name: "writ.replies.agent-a" }]);
    const partial = analyzeTopicAcls(described(...someReplies), TOPICS, OWNERS);
    expect(partial.topics.find((t) => t.role === "replies")).toMatchObject({ ownersMayWrite: false, noAcl: true });
    expect(partial.reason).toBe("owners_cannot_write");
    // a foreign writer is the warning that wins
    expect(analyzeTopicAcls(described(...noDlqWrite, { principal: "User:agent-a", name: "writ.human" }), TOPICS, OWNERS).reason).toBe("foreign_writers");
  });

  it("owner principals: a bare name is a SASL user, lists are comma-separated, a bad one is refused naming the field", () => {
    expect(ownerPrincipals(["writ-owner, User:other", "User:other"])).toEqual(["User:writ-owner", "User:other"]);
    expect(() => ownerPrincipals(["bad name"], "WRIT_OWNER_PRINCIPALS")).toThrow(/WRIT_OWNER_PRINCIPALS: not a Kafka principal/);
    expect(() => ownerPrincipals([" , "])).toThrow(WritError);
    expect(() => ownerPrincipals(["User:"])).toThrow(/not a Kafka principal/);
  });
});

describe("owner principals from the command line and the environment", () => {
  const saved = process.env.WRIT_OWNER_PRINCIPALS;
  afterEach(() => {
    if (saved === undefined) delete process.env.WRIT_OWNER_PRINCIPALS;
    else process.env.WRIT_OWNER_PRINCIPALS = saved;
  });
  it("--owner-principal, else $WRIT_OWNER_PRINCIPALS, else User:writ-owner", () => {
    delete process.env.WRIT_OWNER_PRINCIPALS;
    expect(ownerPrincipalsFrom(undefined)).toEqual(["User:writ-owner"]);
    process.env.WRIT_OWNER_PRINCIPALS = "prod-owner,User:prod-owner-2";
    expect(ownerPrincipalsFrom(undefined)).toEqual(["User:prod-owner", "User:prod-owner-2"]);
    expect(ownerPrincipalsFrom(["ops"])).toEqual(["User:ops"]);
  });
});

describe("the ACL check when DescribeAcls fails (checkTopicAcls)", () => {
  const failing = (err: unknown) => ({ describeAcls: () => Promise.reject(err) });
  it("SECURITY_DISABLED (no authorizer) is a warning: anyone can write the ledger, escalations and replies", async () => {
    const check = await checkTopicAcls(failing(Object.assign(new Error("Security features are disabled"), { type: "SECURITY_DISABLED", code: 54 })), TOPICS, OWNERS);
    expect(check).toMatchObject({ status: "warning", reason: "no_authorizer", topics: [] });
    expect(check.message).toMatch(/no authorizer .*any client can write writ.ledger, writ.human, writ.dlq and the reply topics \(writ.replies.\*\), so forge ledger entries, escalations and replies/);
    expect(check.message).toContain('"Running with SASL/TLS and ACLs"');
    expect(formatAclCheck(check)).toEqual([`ACL WARNING (no_authorizer): ${check.message}`]);
  });
  it("CLUSTER_AUTHORIZATION_FAILED: not checked, said plainly; any other error too", async () => {
    const denied = await checkTopicAcls(failing(Object.assign(new Error("Cluster authorization failed"), { type: "CLUSTER_AUTHORIZATION_FAILED", code: 31 })), TOPICS, OWNERS);
    expect(denied).toMatchObject({ status: "unknown", reason: "acls_not_visible", error: "CLUSTER_AUTHORIZATION_FAILED" });
    expect(denied.message).toContain("may not describe ACLs");
    expect(formatAclCheck(denied)[0]).toMatch(/^ACLS NOT CHECKED \(acls_not_visible\)/);
    expect(aclCheckFailure(new Error("Connection timeout"), TOPICS, OWNERS)).toMatchObject({ status: "unknown", reason: "acl_check_failed", error: "Connection timeout" });
  });
});
