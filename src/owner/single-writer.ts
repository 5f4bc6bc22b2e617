// One writer per ledger partition across consumer groups (docs/architecture.md §5.2). The fence is per
// transactional id, `<group>.<intents topic>.<p>`: owners of another group, or of another intents topic on the
// same ledger, are not fenced by it, and both would write the same records. The ledger's progress entry names the
// group and intents topic that wrote it; an owner that finds another one there while that group still consumes its
// intents topic does not take the partition.
import { AssignerProtocol, PartitionAssigners, type Admin, type PartitionAssigner } from "kafkajs";
import type { RouterConfig } from "../config.ts";
import { WritError } from "../errors.ts";
import type { PartitionLedger } from "../ledger/ledger-state.ts";
import type { Logger } from "../logger.ts";

/**
 * Whether consumer group `group` has a member now whose subscription includes `topic`. A member whose
 * subscription cannot be read (another protocol) counts as one: not proven gone. Throws a retriable
 * {@link WritError} when the group cannot be described (no DESCRIBE on it, the coordinator unreachable).
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
 * The consumer groups other than `config.groupId` with a member that is a writ owner subscribed to this intents
 * topic (by {@link ownerAssigner}'s metadata): each gives every record a second writer, the fence being per group.
 * Only groups the owner may describe are seen (the broker lists no others).
 */
export async function otherOwnerGroups(admin: Admin, config: Pick<RouterConfig, "groupId" | "topics">): Promise<OtherOwnerGroup[]> {
  const { groups } = await admin.listGroups();
  // Owners' ledger readers (`<group>.ledger-reader.<instance>`, `.ledger-scan.`) are never owners: not described.
  const candidates = groups.filter((g) => g.protocolType === "consumer" && g.groupId !== config.groupId && !/\.ledger-(reader|scan)\./.test(g.groupId)).map((g) => g.groupId);
  if (candidates.length === 0) return [];
  const found: OtherOwnerGroup[] = [];
  for (const g of (await admin.describeGroups(candidates)).groups) {
    let members = 0;
    let ledger: string | undefined;
    for (const member of g.members) {
      const mark = ownerMark(member.memberMetadata);
      if (mark === null || mark.intents !== config.topics.intents) continue;
      members++;
      ledger = mark.ledger;
    }
    if (members > 0) found.push({ group: g.groupId, members, ledger });
  }
  return found;
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
