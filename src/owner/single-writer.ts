// One writer per ledger partition across consumer groups (docs/architecture.md §5.2). The fence is per
// transactional id, `<group>.<intents topic>.<p>`: owners of another group, or of another intents topic on the
// same ledger, are not fenced by it, and both would write the same records. The ledger's progress entry names the
// group and intents topic that wrote it; an owner that finds another one there while that group still consumes its
// intents topic does not take the partition (checkSingleWriter). Owners also mark their group membership
// (ownerAssigner) and look for other groups of owners on their intents topic (otherOwnerGroups): at the start, when
// a partition is taken up (checkTakeUp, for a ledger with no progress entry yet), and every minute (router.ts: the
// owner holds its partitions while another group runs).
import { AssignerProtocol, PartitionAssigners, type Admin, type PartitionAssigner } from "kafkajs";
import type { RouterConfig } from "../config.ts";
import { WritError } from "../errors.ts";
import type { PartitionLedger } from "../ledger/ledger-state.ts";
import type { Logger } from "../logger.ts";
import { setTimeout as sleep } from "node:timers/promises";

/**
 * Whether consumer group `group` has a member now whose subscription includes `topic`. A member whose
 * subscription cannot be read counts as one: not proven gone. That is a member of another protocol, one whose
 * metadata does not decode, and one of a group that is rebalancing: DescribeGroups gives a classic group's members
 * their metadata only while it is Stable (Kafka's ClassicGroupMember.describeNoMetadata otherwise), and the group
 * asked about is one known to have written the ledger. Throws a retriable {@link WritError} when the group cannot
 * be described (no DESCRIBE on it, the coordinator unreachable).
 */
export async function groupConsumes(admin: Admin, group: string, topic: string): Promise<boolean> {
  let described: Awaited<ReturnType<Admin["describeGroups"]>>;
  try {
    described = await admin.describeGroups([group]);
  } catch (err) {
    throw new WritError(
      "kafka_failed",
      `cannot tell whether consumer group ${group} still consumes ${topic}: ${(err as Error)?.message ?? String(err)} (the owners need DESCRIBE on that group)`,
      { retriable: true, cause: err, context: { group, topic } },
    );
  }
  const found = described.groups.find((g) => g.groupId === group);
  if (found === undefined) throw new WritError("kafka_failed", `describing consumer group ${group} came back without it`, { retriable: true, context: { group } });
  for (const member of found.members) {
    if (found.protocolType !== "consumer") return true;
    if (found.state !== "Stable" && member.memberMetadata.length === 0) return true;
    const subscription = subscriptionOf(member.memberMetadata);
    if (subscription === null || subscription.topics.includes(topic)) return true;
  }
  return false;
}

/**
 * Refuses (`ledger_foreign_writer`, retriable: the partition opens once the other group stops) a ledger partition
 * whose progress entry another group, or the owners of another intents topic, wrote while that group still
 * consumes its intents topic; takes it over, with a warning, from one that no longer does (a renamed group).
 */
export async function checkSingleWriter(admin: Admin, config: RouterConfig, ledger: PartitionLedger, log: Logger): Promise<void> {
  const writer = ledger.progressWriter;
  if (writer === null) return;
  const topic = writer.intentsTopic ?? config.topics.intents;
  if (writer.group === config.groupId && topic === config.topics.intents) return;
  const partition = ledger.partition;
  const context = { partition, ledger: config.topics.ledger, otherGroup: writer.group, otherIntentsTopic: topic, group: config.groupId, intentsTopic: config.topics.intents };
  if (await groupConsumes(admin, writer.group, topic)) {
    throw new WritError(
      "ledger_foreign_writer",
      `ledger partition ${config.topics.ledger}-${partition} is written by consumer group ${writer.group} for intents topic ${topic}, which still consumes it; ` +
        `owning it from group ${config.groupId} (intents topic ${config.topics.intents}) would give its records two writers. ` +
        "Run one group per intents topic and a ledger topic per intents topic (WRIT_GROUP_ID, WRIT_INTENTS_TOPIC, WRIT_LEDGER_TOPIC); this partition opens once that group has stopped",
      { retriable: true, context },
    );
  }
  // The logger already names the partition (a key twice in one line breaks strict JSON parsers).
  const { partition: _named, ...fields } = context;
  log.warn(fields, "taking over a ledger partition last written by another group or intents topic, which no longer consumes it (a renamed group?)");
}

/** What an owner says about itself in its group membership (the consumer protocol's user data): JSON. */
const OWNER_MARK = "writ-owner";

/**
 * kafkajs's round-robin assigner, whose membership metadata also says that the member is a writ owner and of
 * which intents and ledger topics ({@link otherOwnerGroups} reads it from other groups). The protocol's name is
 * kafkajs's own, so members of versions before it join the same group.
 */
export function ownerAssigner(topics: { intents: string; ledger: string }): PartitionAssigner {
  return (options) => {
    const base = PartitionAssigners.roundRobin(options);
    const userData = Buffer.from(JSON.stringify({ [OWNER_MARK]: 1, intents: topics.intents, ledger: topics.ledger }));
    return { ...base, protocol: ({ topics: subscribed }) => ({ name: base.name, metadata: AssignerProtocol.MemberMetadata.encode({ version: base.version, topics: subscribed, userData }) }) };
  };
}

/** Another consumer group running writ owners on this intents topic: its members and the ledger topic they say they write. */
export interface OtherOwnerGroup {
  group: string;
  members: number;
  ledger: string | undefined;
}

/**
 * A consumer group that was rebalancing each time it was described, with members that may be writ owners of this
 * intents topic: DescribeGroups gives a classic group's members their metadata (where the owner's mark is) only
 * while it is Stable, and their current assignment in every state. A member counts when that assignment names this
 * intents topic; not when it names other topics only, nor when it has none (a member that has not yet been given
 * one, of any application: counting those would let any unrelated group that is slow to rebalance hold an owner's
 * take-up; a writ owner without an assignment writes nothing, and looks itself once it has one).
 */
export interface UndeterminedGroup {
  group: string;
  state: string;
  members: number;
}

/** What {@link otherOwnerGroups} found: groups of owners of this intents topic, and groups it could not tell. */
export interface OwnerGroupsLook {
  owners: OtherOwnerGroup[];
  undetermined: UndeterminedGroup[];
}

/** How long {@link otherOwnerGroups} waits before describing a rebalancing group again, each time; ms. About 5 s in all, past Kafka's default group.initial.rebalance.delay.ms (3 s) of a new group's first join. */
export const REDESCRIBE_WAITS_MS: readonly number[] = [250, 500, 1000, 1500, 2000];

/**
 * The consumer groups other than `config.groupId` with a member that is a writ owner subscribed to this intents
 * topic (by {@link ownerAssigner}'s metadata): each gives every record a second writer, the fence being per group.
 * Only groups the owner may describe are seen (the broker lists no others). A group that is rebalancing shows no
 * member metadata: it is described again after each of `waitsMs` (a bounded wait; a rebalance takes a moment), and
 * one still rebalancing with members that may be owners is returned as undetermined.
 */
export async function otherOwnerGroups(
  admin: Admin,
  config: Pick<RouterConfig, "groupId" | "topics">,
  waitsMs: readonly number[] = REDESCRIBE_WAITS_MS,
  memory: GroupMemory = new GroupMemory(),
): Promise<OwnerGroupsLook> {
  const { groups } = await admin.listGroups();
  // Owners' ledger readers (`<group>.ledger-reader.<instance>`, `.ledger-scan.`) are never owners: not described.
  let candidates = groups.filter((g) => g.protocolType === "consumer" && g.groupId !== config.groupId && !/\.ledger-(reader|scan)\./.test(g.groupId)).map((g) => g.groupId);
  const owners: OtherOwnerGroup[] = [];
  let undetermined: UndeterminedGroup[] = [];
  for (let round = 0; candidates.length > 0; round++) {
    undetermined = [];
    for (const g of (await admin.describeGroups(candidates)).groups) {
      const seen = describedOwners(g, config.topics.intents, memory);
      if (seen.kind === "owners") owners.push({ group: g.groupId, members: seen.members, ledger: seen.ledger });
      else if (seen.kind === "undetermined") undetermined.push({ group: g.groupId, state: g.state, members: seen.members });
    }
    const wait = waitsMs[round];
    if (undetermined.length === 0 || wait === undefined) break;
    await sleep(wait);
    candidates = undetermined.map((u) => u.group);
  }
  return { owners, undetermined };
}

/**
 * What one owner process learnt about other consumer groups from its earlier looks, for the moments a group is
 * rebalancing and DescribeGroups shows its members without metadata: a group once seen with owners of this intents
 * topic is taken for one while it rebalances, whatever its members' assignments show (Kafka before 4.0 shows none
 * then, and 4.x none after a rebalance interrupted while members sync); a group once seen Stable with members and no
 * owner among them (an archiver or a sink reading the intents topic) is not waited for. Bounded: each set forgets
 * its oldest names past 10,000.
 */
export class GroupMemory {
  private readonly owners = new Set<string>();
  private readonly others = new Set<string>();

  /** What the memory says of a group it cannot read now: an owner group, another application's, or unknown. */
  knownAs(group: string): "owners" | "other" | "unknown" {
    return this.owners.has(group) ? "owners" : this.others.has(group) ? "other" : "unknown";
  }

  /** A group read in full (Stable, with members): owners of this intents topic or not. */
  seen(group: string, owners: boolean): void {
    const into = owners ? this.owners : this.others;
    (owners ? this.others : this.owners).delete(group);
    into.delete(group);
    into.add(group);
    if (into.size > 10_000) into.delete(into.values().next().value!);
  }
}

/** One described group: owners of `intents` (by their marks), maybe owners (rebalancing, see {@link UndeterminedGroup}), or none. */
function describedOwners(
  g: Awaited<ReturnType<Admin["describeGroups"]>>["groups"][number],
  intents: string,
  memory: GroupMemory,
): { kind: "owners"; members: number; ledger: string | undefined } | { kind: "undetermined"; members: number } | { kind: "none" } {
  let members = 0;
  let ledger: string | undefined;
  let unreadable = 0;
  let hidden = 0;
  const known = memory.knownAs(g.groupId);
  for (const member of g.members) {
    if (member.memberMetadata.length === 0 && g.state !== "Stable") {
      hidden++;
      const assigned = assignmentOf(member.memberAssignment);
      // Assigned this intents topic, or (a group once seen with owners) whatever it shows: maybe an owner.
      if (known === "owners" || (known === "unknown" && assigned !== null && assigned.includes(intents))) unreadable++;
      continue;
    }
    const mark = ownerMark(member.memberMetadata);
    if (mark === null || mark.intents !== intents) continue;
    members++;
    ledger = mark.ledger;
  }
  if (g.state === "Stable" && g.members.length > 0 && hidden === 0) memory.seen(g.groupId, members > 0);
  if (members > 0) return { kind: "owners", members, ledger };
  return unreadable > 0 ? { kind: "undetermined", members: unreadable } : { kind: "none" };
}

/**
 * Whether each of `groups` (the other groups of owners a hold was started for) is gone: Empty or Dead, without
 * members, or Stable with no owner of this intents topic among its members. A group rebalancing is not gone: its
 * members show no metadata then. Throws when they cannot be described (the hold then goes on).
 */
export async function ownerGroupsGone(admin: Admin, groups: readonly string[], intents: string): Promise<boolean> {
  if (groups.length === 0) return true;
  const described = await admin.describeGroups([...groups]);
  return groups.every((group) => {
    const g = described.groups.find((d) => d.groupId === group);
    if (g === undefined || g.members.length === 0 || g.state === "Empty" || g.state === "Dead") return true;
    if (g.state !== "Stable") return false;
    return g.members.every((m) => ownerMark(m.memberMetadata)?.intents !== intents);
  });
}

/** The topics a member's current assignment names; null when it has none (empty, or it does not decode: not proven elsewhere). */
function assignmentOf(assignment: Buffer): string[] | null {
  try {
    const decoded = assignment.length === 0 ? null : AssignerProtocol.MemberAssignment.decode(assignment);
    const topics = decoded === null ? [] : Object.keys(decoded.assignment).filter((t) => (decoded.assignment[t] ?? []).length > 0);
    return topics.length === 0 ? null : topics;
  } catch {
    return null;
  }
}

/** A consumer group member's subscription (its topics and user data; none for empty metadata), or null when its metadata does not decode. */
function subscriptionOf(metadata: Buffer): { topics: string[]; userData: Buffer | undefined } | null {
  try {
    const decoded = AssignerProtocol.MemberMetadata.decode(metadata);
    return decoded === null ? { topics: [], userData: undefined } : { topics: decoded.topics, userData: decoded.userData };
  } catch {
    return null;
  }
}

/** The owner's mark in a member's metadata, if it carries one; bounded: the metadata is another client's bytes. */
function ownerMark(metadata: Buffer): { intents: string; ledger: string | undefined } | null {
  const userData = subscriptionOf(metadata)?.userData;
  try {
    if (!Buffer.isBuffer(userData) || userData.length === 0 || userData.length > 4096) return null;
    const parsed: unknown = JSON.parse(userData.toString("utf8"));
    if (typeof parsed !== "object" || parsed === null || (parsed as Record<string, unknown>)[OWNER_MARK] !== 1) return null;
    const { intents, ledger } = parsed as Record<string, unknown>;
    return typeof intents === "string" ? { intents, ledger: typeof ledger === "string" ? ledger : undefined } : null;
  } catch {
    return null;
  }
}

/** The message for other owner groups on this intents topic. */
export function otherOwnersMessage(config: Pick<RouterConfig, "groupId" | "topics">, others: readonly OtherOwnerGroup[]): string {
  const named = others.map((o) => `${o.group} (${o.members} member${o.members === 1 ? "" : "s"}${o.ledger ? `, ledger ${o.ledger}` : ""})`).join(", ");
  return (
    `writ owners of consumer group${others.length === 1 ? "" : "s"} ${named} also consume intents topic ${config.topics.intents}: ` +
    `with this group (${config.groupId}) every record would have two writers, the fence being per group. ` +
    "Run one group of owners per intents topic (WRIT_GROUP_ID); to rename the group, stop the other group's owners first"
  );
}

/**
 * The take-up check, run first when intents partition `partition` is opened: before its producer connects (the
 * fence), before the marker goes into the ledger partition (which another group may share) and before the ledger is
 * read, so that a partition it refuses costs no restore and writes nothing, each time it is tried. It closes what
 * {@link checkSingleWriter} leaves open (that one needs the restored ledger's progress entry, so it runs after the
 * restore: two groups started at once on a ledger without one would both pass it, and the start's check too, neither
 * having joined when the other looked). Another group of owners of this intents topic running: `config_invalid`, and
 * this owner stops, as at the start (the group that finds the other steps aside and leaves its consumer group). A
 * group rebalancing that may be one ({@link otherOwnerGroups}): refused, `ledger_foreign_writer`, retriable (tried
 * again every 30 s).
 *
 * Why two groups never both take up a partition: each member looks only after its own join (kafkajs restores a
 * partition from the assignment its join brought, after SyncGroup), and from its join on the member is seen by every
 * describe of its group: with its owner mark while the group is Stable; while it rebalances as a member assigned this
 * intents topic, since a member keeps its assignment through a rebalance, or as a group this process saw with owners
 * before ({@link GroupMemory}). Say group A's member joined first, at jA ≤ jB. Group B's member looks at tB > jB ≥ jA
 * and sees A's member (unless it has left): B stops. A's member, looking at tA > jA, takes the partition only if it
 * looked before B's member joined. So at most one of them takes it up: the one that looked first, if it looked before
 * the other joined; if both looked after both joined, both stop (a supervisor restarts them, and the start's check
 * then lets one run). `look` is memoized per join (router.ts): a look from before this member's latest join is never
 * used, and an open starts after the join that brought its partition (or later: a retry, a hold's end), so the look
 * it begins with is after that join. One case escapes it: a look taken while A's rebalance is interrupted as its
 * members sync (Kafka then empties their assignments; before 4.0, any rebalance shows none), by a process that has
 * not seen A Stable before; A keeps the partitions it already owns through a rebalance (no restore), so the minute's
 * watch is what then finds B: both hold within a minute.
 *
 * The look is not taken again before the partition's first write, however long the restore took: the argument places
 * each look against the two joins only, never against the writes that follow it. A that looked before B joined takes
 * the partition whenever it then writes, since B's look, after B's join, sees A; a second look by A could only stop A
 * too (B not gone yet) or refuse it for 30 s (B rebalancing as it leaves): an outage, and no second writer prevented.
 * A group no look can see is the watch's, as above.
 */
export async function checkTakeUp(look: () => Promise<OwnerGroupsLook>, config: Pick<RouterConfig, "groupId" | "topics">, partition: number): Promise<void> {
  const where = `ledger partition ${config.topics.ledger}-${partition}`;
  const context = { partition, ledger: config.topics.ledger, group: config.groupId, intentsTopic: config.topics.intents };
  let found: OwnerGroupsLook;
  try {
    found = await look();
  } catch (err) {
    throw new WritError(
      "kafka_failed",
      `cannot tell whether another group of owners consumes intents topic ${config.topics.intents} (listing or describing the consumer groups failed: ${(err as Error)?.message ?? String(err)}); not taking up ${where} until it can`,
      { retriable: true, cause: err, context },
    );
  }
  if (found.owners.length > 0) {
    // As at the start: the group that finds another one running steps aside (its owners stop and leave their group),
    // rather than staying a member that writes nothing, which the other group's watch would take for a second writer.
    throw new WritError("config_invalid", `${otherOwnersMessage(config, found.owners)}. Not taking up ${where}: this owner stops`, {
      retriable: false,
      context: { ...context, field: "groupId", otherGroups: found.owners.map((o) => o.group) },
    });
  }
  if (found.undetermined.length > 0) {
    const named = found.undetermined.map((u) => `${u.group} (${u.state}, ${u.members} member${u.members === 1 ? "" : "s"})`).join(", ");
    throw new WritError(
      "ledger_foreign_writer",
      `consumer group${found.undetermined.length === 1 ? "" : "s"} ${named} kept rebalancing while described, so whether ${found.undetermined.length === 1 ? "it is" : "they are"} writ owners of intents topic ${config.topics.intents} cannot be told ` +
        `(DescribeGroups gives a group's member metadata only while it is Stable). Not taking up ${where} until it can (tried again every 30 s): owners of another group would give its records two writers`,
      { retriable: true, context: { ...context, otherGroups: found.undetermined.map((u) => u.group) } },
    );
  }
}

/** The message for other owner groups found by the watch: this owner holds its partitions while they run. */
export function holdingMessage(config: Pick<RouterConfig, "groupId" | "topics">, others: readonly OtherOwnerGroup[]): string {
  return (
    `${otherOwnersMessage(config, others)}. This owner holds its partitions meanwhile: it takes no new intents (those in flight finish; ` +
    "offsets do not pass an intent not processed) and takes them up again once no other group of owners consumes the intents topic. If both groups hold, stop one of the groups"
  );
}
