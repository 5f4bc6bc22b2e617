// A writ client whose owner is a script, for the adapter unit tests (no broker).
import type { IntentInput, SubmitResult, WritClient } from "../../producers/writ-client.ts";

/** A client whose owner is a script: `answer` gives the n-th submission's reply (or throws); every submission is kept. */
export function scripted(answer: (i: IntentInput, n: number) => SubmitResult) {
  const sent: IntentInput[] = [];
  const client = {
    agentId: "support-bob",
    submit: async (i: IntentInput) => {
      sent.push(i);
      return answer(i, sent.length);
    },
  } as unknown as WritClient;
  return { client, sent };
}
