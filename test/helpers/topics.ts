import type { Admin, ITopicConfig } from "kafkajs";
import { waitForLeaders } from "../../src/topics.ts";

/**
 * Creates `topics` and waits until every partition has a leader; resolves to createTopics's answer (false when one
 * already existed). Not kafkajs's `waitForLeaders: true`: that retries only LEADER_NOT_AVAILABLE, and a KRaft broker
 * that has just created a topic can still answer UNKNOWN_TOPIC_OR_PARTITION to the metadata request that follows
 * (its metadata cache not yet caught up with the controller), which fails the whole call.
 */
export async function createTopicsWithLeaders(admin: Admin, topics: ITopicConfig[]): Promise<boolean> {
  const created = await admin.createTopics({ topics, waitForLeaders: false });
  await waitForLeaders(admin, topics.map((t) => t.topic));
  return created;
}
