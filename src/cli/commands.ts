// The `writ` commands, by name, each loaded only when asked for (src/cli/main.ts runs them; the CLI's tests
// read every command's usage and flags from here).
import type { Command } from "./common.ts";

/** Each command, with the line `writ help` shows for it (kept here so that help loads no command). */
export const COMMANDS: Record<string, { summary: string; load: () => Promise<Command> }> = {
  owner: { summary: "run the owners of writ.intents for a tools module (the owner process)", load: async () => (await import("./owner.ts")).ownerCommand },
  submit: { summary: "send one write intent, wait for the owner's reply, print it as JSON", load: async () => (await import("./submit.ts")).submitCommand },
  undo: { summary: "undo an applied write once (its tool's compensating change), print the reply as JSON", load: async () => (await import("./undo.ts")).undoCommand },
  tail: { summary: "print (and follow) replies, escalations, dead letters or ledger entries", load: async () => (await import("./tail.ts")).tailCommand },
  escalations: { summary: "list the escalations on writ.human, or resolve one (a person's decision)", load: async () => (await import("./escalations.ts")).escalationsCommand },
  topics: { summary: "create (ensure) or check the contract topics", load: async () => (await import("./topics.ts")).topicsCommand },
  verify: { summary: "prove a tools module's write tools against a staging system of record", load: async () => (await import("./verify.ts")).verifyCommand },
  dlq: { summary: "send dead-lettered records back to the intents topic once their cause is fixed (redrive)", load: async () => (await import("./dlq.ts")).dlqCommand },
  doctor: { summary: "find (and --abort) hanging transactions on writ's topics", load: async () => (await import("./doctor.ts")).doctorCommand },
  console: { summary: "the operator console: a live web page of writ's topics; resolve escalations from it", load: async () => (await import("../console/command.ts")).consoleCommand },
};
