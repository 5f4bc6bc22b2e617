// What an owner reads from DescribeGroups of another group (src/owner/single-writer.ts), with a fake admin: Kafka
// gives a classic group's members their metadata only while it is Stable (ClassicGroupMember.describeNoMetadata
// otherwise), and their current assignment in every state.
import { AssignerProtocol, type Admin, type GroupDescription } from "kafkajs";
import { describe, expect, it } from "vitest";
import { checkTakeUp, GroupMemory, groupConsumes, otherOwnerGroups, ownerGroupsGone } from "../../../src/owner/single-writer.ts";

const INTENTS = "writ.intents";
const config = { groupId: "writ.owners", topics: { intents: INTENTS, ledger: "writ.ledger", human: "writ.human", dlq: "writ.dlq" } } as const;

/** A member's metadata as ownerAssigner writes it (marked), or as a plain kafkajs consumer does (no user data). */
function metadata(topics: string[], owner: boolean): Buffer {
  const userData = owner ? Buffer.from(JSON.stringify({ "writ-owner": 1, intents: INTENTS, ledger: "writ.ledger.b" })) : Buffer.alloc(0);
  return AssignerProtocol.MemberMetadata.encode({ version: 1, topics, userData });
}

function assignment(topic: string | null): Buffer {
  return topic === null ? Buffer.alloc(0) : AssignerProtocol.MemberAssignment.encode({ version: 1, assignment: { [topic]: [0, 1] }, userData: Buffer.alloc(0) });
}

type State = GroupDescription["state"];

/** A group as DescribeGroups gives it: members with metadata only while Stable. */
function group(groupId: string, state: State, members: { topics: string[]; owner: boolean; assigned: string | null }[]): GroupDescription {
  return {
    groupId,
    state,
    protocol: state === "Stable" ? "RoundRobinAssigner" : "",
    protocolType: "consumer",
    members: members.map((m, i) => ({
      memberId: `${groupId}-${i}`,
      clientId: "c",
      clientHost: "/127.0.0.1",
      memberMetadata: state === "Stable" ? metadata(m.topics, m.owner) : Buffer.alloc(0),
      memberAssignment: assignment(m.assigned),
    })),
  };
}

/** An admin whose groups go through `states` one describe after another (the last one stays). */
function fakeAdmin(timeline: Record<string, GroupDescription[]>): Admin & { describes: string[][] } {
  const seen = new Map<string, number>();
  const describes: string[][] = [];
  const admin = {
    describes,
    listGroups: async () => ({ groups: Object.keys(timeline).map((groupId) => ({ groupId, protocolType: "consumer" })) }),
    describeGroups: async (ids: string[]) => {
      describes.push(ids);
      return {
        groups: ids.map((id) => {
          const n = seen.get(id) ?? 0;
          seen.set(id, n + 1);
          const states = timeline[id]!;
          return states[Math.min(n, states.length - 1)]!;
        }),
      };
    },
  };
  return admin as unknown as Admin & { describes: string[][] };
}

const ownerMember = { topics: [INTENTS], owner: true, assigned: INTENTS };

describe("groupConsumes, of a group that wrote the ledger", () => {
  it("counts a member without metadata in a rebalancing group as consuming, and one of a Stable group by its subscription", async () => {
    const admin = fakeAdmin({
      rebalancing: [group("rebalancing", "PreparingRebalance", [{ topics: [], owner: false, assigned: null }])],
      completing: [group("completing", "CompletingRebalance", [{ topics: [], owner: false, assigned: "other.topic" }])],
      stableElsewhere: [group("stableElsewhere", "Stable", [{ topics: ["other.topic"], owner: false, assigned: "other.topic" }])],
      stableHere: [group("stableHere", "Stable", [{ topics: [INTENTS], owner: false, assigned: INTENTS }])],
      empty: [group("empty", "Empty", [])],
    });
    expect(await groupConsumes(admin, "rebalancing", INTENTS)).toBe(true);
    expect(await groupConsumes(admin, "completing", INTENTS)).toBe(true);
    expect(await groupConsumes(admin, "stableElsewhere", INTENTS)).toBe(false);
    expect(await groupConsumes(admin, "stableHere", INTENTS)).toBe(true);
    expect(await groupConsumes(admin, "empty", INTENTS)).toBe(false);
  });
});

describe("otherOwnerGroups", () => {
  const noWaits = [0, 0, 0];

  it("reads the owner mark of a Stable group, and describes a rebalancing one again until it is Stable", async () => {
    const admin = fakeAdmin({
      "writ.owners": [group("writ.owners", "Stable", [ownerMember])],
      "other.owners": [group("other.owners", "PreparingRebalance", [ownerMember]), group("other.owners", "CompletingRebalance", [ownerMember]), group("other.owners", "Stable", [ownerMember])],
      "plain.consumer": [group("plain.consumer", "Stable", [{ topics: [INTENTS], owner: false, assigned: INTENTS }])],
    });
    const look = await otherOwnerGroups(admin, config, noWaits);
    expect(look).toEqual({ owners: [{ group: "other.owners", members: 1, ledger: "writ.ledger.b" }], undetermined: [] });
    // Only the rebalancing group is described again.
    expect(admin.describes).toEqual([["other.owners", "plain.consumer"], ["other.owners"], ["other.owners"]]);
  });

  it("a group still rebalancing after the waits, with a member assigned this intents topic, is undetermined", async () => {
    const admin = fakeAdmin({
      "assigned.intents": [group("assigned.intents", "PreparingRebalance", [ownerMember])],
    });
    const look = await otherOwnerGroups(admin, config, noWaits);
    expect(look.owners).toEqual([]);
    expect(look.undetermined.map((u) => u.group)).toEqual(["assigned.intents"]);
    expect(admin.describes).toHaveLength(noWaits.length + 1);
    await expect(checkTakeUp(async () => look, config, 3)).rejects.toMatchObject({ code: "ledger_foreign_writer", retriable: true, message: expect.stringContaining("assigned.intents") });
  });

  it("does not wait for a rebalancing group whose members are assigned other topics only or nothing yet (agent clients' reply consumers, any other application)", async () => {
    const admin = fakeAdmin({
      "other.app.joining": [group("other.app.joining", "PreparingRebalance", [{ topics: [], owner: false, assigned: null }])],
      "writ.client.billing-agent.6f1c": [group("writ.client.billing-agent.6f1c", "PreparingRebalance", [{ topics: [], owner: false, assigned: null }])],
      "writ.client.billing-agent.77aa": [group("writ.client.billing-agent.77aa", "CompletingRebalance", [{ topics: [], owner: false, assigned: "writ.replies.billing-agent" }])],
      "other.app": [group("other.app", "PreparingRebalance", [{ topics: [], owner: false, assigned: "other.topic" }])],
    });
    const look = await otherOwnerGroups(admin, config, noWaits);
    expect(look).toEqual({ owners: [], undetermined: [] });
    expect(admin.describes).toHaveLength(1);
    await expect(checkTakeUp(async () => look, config, 0)).resolves.toBeUndefined();
  });

  it("the take-up check stops this owner (config_invalid, as at the start) while another group of owners runs, naming it", async () => {
    const admin = fakeAdmin({ "other.owners": [group("other.owners", "Stable", [ownerMember, ownerMember])] });
    const look = () => otherOwnerGroups(admin, config, noWaits);
    await expect(checkTakeUp(look, config, 2)).rejects.toMatchObject({
      code: "config_invalid",
      retriable: false,
      message: expect.stringContaining("writ owners of consumer group other.owners (2 members, ledger writ.ledger.b) also consume intents topic writ.intents"),
      context: expect.objectContaining({ partition: 2, otherGroups: ["other.owners"] }),
    });
  });

  it("remembers what it saw Stable: a group once seen with owners counts while it rebalances whatever its members show (Kafka before 4.0 shows no assignment); one seen without owners is not waited for", async () => {
    const memory = new GroupMemory();
    const noAssignment = { topics: [], owner: false, assigned: null };
    const admin = fakeAdmin({
      "other.owners": [group("other.owners", "Stable", [ownerMember]), group("other.owners", "PreparingRebalance", [noAssignment])],
      "s3.archiver": [group("s3.archiver", "Stable", [{ topics: [INTENTS], owner: false, assigned: INTENTS }]), group("s3.archiver", "PreparingRebalance", [{ topics: [], owner: false, assigned: INTENTS }])],
    });
    expect((await otherOwnerGroups(admin, config, [], memory)).owners.map((o) => o.group)).toEqual(["other.owners"]);
    expect(memory.knownAs("other.owners")).toBe("owners");
    expect(memory.knownAs("s3.archiver")).toBe("other");
    const rebalancing = await otherOwnerGroups(admin, config, [], memory);
    expect(rebalancing).toEqual({ owners: [], undetermined: [{ group: "other.owners", state: "PreparingRebalance", members: 1 }] });
    // Without the memory (another process, or one that never saw them Stable): the owners' group unseen, the archiver waited for.
    const fresh = await otherOwnerGroups(admin, config, []);
    expect(fresh.undetermined.map((u) => u.group)).toEqual(["s3.archiver"]);
  });
});

describe("ownerGroupsGone, which ends a hold", () => {
  it("is true once each group is Empty, Dead, unlisted or Stable without owners of this intents topic; not while one rebalances or still has owners", async () => {
    const admin = fakeAdmin({
      empty: [group("empty", "Empty", [])],
      dead: [group("dead", "Dead", [])],
      plain: [group("plain", "Stable", [{ topics: [INTENTS], owner: false, assigned: INTENTS }])],
      rebalancing: [group("rebalancing", "PreparingRebalance", [{ topics: [], owner: false, assigned: null }])],
      owners: [group("owners", "Stable", [ownerMember])],
    });
    expect(await ownerGroupsGone(admin, ["empty", "dead", "plain"], INTENTS)).toBe(true);
    expect(await ownerGroupsGone(admin, ["empty", "rebalancing"], INTENTS)).toBe(false);
    expect(await ownerGroupsGone(admin, ["owners"], INTENTS)).toBe(false);
    expect(await ownerGroupsGone(admin, [], INTENTS)).toBe(true);
  });
});
