export { createWritClient, type WritClient, type IntentInput, type SubmitResult, type UnknownOutcome } from "./writ-client.ts";
export { intentKey } from "../src/keys.ts";
