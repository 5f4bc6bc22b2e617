// Subjects of a test's own on the real registry, through its Confluent API: set up with a level and a version
// writ's schema is incompatible with, and deleted (soft, then for good) when the test finishes.
import { expect, onTestFinished } from "vitest";
import { registryUrl } from "./writ-harness.ts";

export const ccompat = (path: string, method = "GET", body?: unknown) =>
  fetch(`${registryUrl()}${path}`, { method, headers: { "content-type": "application/vnd.schemaregistry.v1+json" }, ...(body === undefined ? {} : { body: JSON.stringify(body) }) });

export function deletedAfterTest(subject: string): void {
  onTestFinished(async () => {
    await ccompat(`/subjects/${subject}`, "DELETE");
    await ccompat(`/subjects/${subject}?permanent=true`, "DELETE");
  });
}

/** `subject` holding one schema that writ's is incompatible with, at FULL: the registry refuses writ's (409). */
export async function refusingSubject(subject: string): Promise<void> {
  deletedAfterTest(subject);
  // Titled by its subject: a schema's content is the registry's, shared by every subject that holds the same text,
  // and deleting a subject for good (deletedAfterTest) drops content no subject holds any more; another file
  // registering the same text at that moment (files run two at a time) would meet it gone.
  const closed = { title: subject, type: "object", properties: { other: { type: "string" } }, required: ["other"], additionalProperties: false };
  expect((await ccompat(`/subjects/${subject}/versions`, "POST", { schemaType: "JSON", schema: JSON.stringify(closed) })).status).toBe(200);
  expect((await ccompat(`/config/${subject}`, "PUT", { compatibility: "FULL" })).status).toBe(200);
}
