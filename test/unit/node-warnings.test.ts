// kafkajs's TimeoutNegativeWarning: hidden by createWritClient itself (a library user calls nothing), and only it.
// In a child process: the test setup hides it in this one already.
import { execFile } from "node:child_process";
import { resolve } from "node:path";
import { describe, expect, it } from "vitest";

const root = resolve(import.meta.dirname, "..", "..");

function runNode(program: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(process.execPath, ["--input-type=module", "-e", program], { cwd: root, env: { ...process.env, NODE_OPTIONS: "" } }, (error, stdout, stderr) => {
      done({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, stdout, stderr });
    });
  });
}

describe("kafkajs's TimeoutNegativeWarning", () => {
  it("is not printed in a program that creates a client, while every other warning still is, to Node and to listeners", async () => {
    const { code, stdout, stderr } = await runNode(`
      import { createWritClient } from "./producers/writ-client.ts";
      import { hideKafkajsTimeoutWarning } from "./src/node-warnings.ts";
      const heard = [];
      process.on("warning", (w) => heard.push(w.name));
      // a bad configuration fails at once, without Kafka; the client's start has run by then
      await createWritClient({ agentId: "a", replyTopic: "writ.replies.a" }).catch(() => undefined);
      const wrapped = process.emitWarning;
      hideKafkajsTimeoutWarning();
      setTimeout(() => {}, -1);
      process.emitWarning("still said", "OtherWarning");
      setTimeout(() => console.log(JSON.stringify({ heard, once: process.emitWarning === wrapped })), 20);
    `);
    expect(code, stderr).toBe(0);
    expect(stderr).not.toContain("TimeoutNegativeWarning");
    expect(stderr).toContain("OtherWarning: still said");
    expect(JSON.parse(stdout)).toEqual({ heard: ["OtherWarning"], once: true });
  });

  it("is printed without writ (the check above sees it when it is there)", async () => {
    const { stderr } = await runNode("setTimeout(() => {}, -1);");
    expect(stderr).toContain("TimeoutNegativeWarning");
  });
});
