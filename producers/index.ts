export { createWritClient, type WritClient, type IntentInput, type SubmitResult, type UnknownOutcome } from "./writ-client.ts";
export { runChange, type ChangeInput, type ChangeStep, type ChangeResult } from "./change.ts";
export { intentKey } from "../src/keys.ts";
