// What a local stack's start takes for its own broker (src/testing/stack-process.ts judgeNodeAnswer): only an answer
// of the cluster formatted into the node's data dir. Another cluster's answer is another stack's broker on the port.
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { formattedClusterId, judgeNodeAnswer } from "../../src/testing/stack-process.ts";

const OURS = "K2qw14solvb3TpvkU8jT4w";
const THEIRS = "pQ0h8r3WS6-7LNz1Zy0aBg";

describe("judgeNodeAnswer", () => {
  it("serves only as the cluster in its data dir, with a controller and every broker expected", () => {
    expect(judgeNodeAnswer(undefined, [], OURS)).toBe("not yet");
    expect(judgeNodeAnswer({ clusterId: OURS, brokerIds: [1], controller: 1 }, [], OURS)).toBe("serves");
    expect(judgeNodeAnswer({ clusterId: OURS, brokerIds: [1], controller: -1 }, [], OURS)).toBe("not yet");
    expect(judgeNodeAnswer({ clusterId: OURS, brokerIds: [], controller: 1 }, [], OURS)).toBe("not yet");
    expect(judgeNodeAnswer({ clusterId: OURS, brokerIds: [1, 2], controller: 1 }, [1, 2, 3], OURS)).toBe("not yet");
    expect(judgeNodeAnswer({ clusterId: OURS, brokerIds: [1, 2, 3], controller: 2 }, [1, 2, 3], OURS)).toBe("serves");
  });

  it("another cluster's broker, serving or not, is another stack's: never ours", () => {
    expect(judgeNodeAnswer({ clusterId: THEIRS, brokerIds: [1], controller: 1 }, [], OURS)).toEqual({ otherCluster: THEIRS });
    expect(judgeNodeAnswer({ clusterId: THEIRS, brokerIds: [1], controller: -1 }, [1], OURS)).toEqual({ otherCluster: THEIRS });
  });

  it("without a cluster id to hold it to (a reuse, not a start), any serving broker will do", () => {
    expect(judgeNodeAnswer({ clusterId: THEIRS, brokerIds: [1], controller: 1 }, [], undefined)).toBe("serves");
  });
});

describe("formattedClusterId", () => {
  it("reads cluster.id from the data dir's meta.properties; undefined before the format", () => {
    const dir = mkdtempSync(join(tmpdir(), "writ-stack-identity-"));
    expect(formattedClusterId(join(dir, "kafka-data"))).toBeUndefined();
    mkdirSync(join(dir, "kafka-data"));
    writeFileSync(join(dir, "kafka-data", "meta.properties"), `#\n#Mon Dec 07 10:51:15 UTC 2026\nnode.id=1\ndirectory.id=APqo8dJKTRaLEppr3nDzVw\nversion=1\ncluster.id=${OURS}\n`);
    expect(formattedClusterId(join(dir, "kafka-data"))).toBe(OURS);
  });
});
