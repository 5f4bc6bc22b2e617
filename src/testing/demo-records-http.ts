import type { IncomingMessage, ServerResponse } from "node:http";
import { CANONICAL_MAX_DEPTH, jsonDepth } from "../canonical-json.ts";
import { formatEtag } from "./demo-records-store.ts";
import type { StoredRecord } from "./demo-records-store.ts";

/** HTTP plumbing of the demo records server: preconditions, bodies, answers. */

const MAX_BODY_BYTES = 1 << 20;

/** Thrown inside a handler; answered as an RFC 9457 problem. */
export class HttpProblem extends Error {
  readonly status: number;
  readonly slug: string;
  constructor(status: number, slug: string, detail: string) {
    super(detail);
    this.status = status;
    this.slug = slug;
  }
}

export function header(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return Array.isArray(value) ? value.join(", ") : value;
}

export function mediaType(req: IncomingMessage): string {
  return (header(req, "content-type") ?? "").split(";")[0]?.trim().toLowerCase() ?? "";
}

/** Entity tags in an If-Match / If-None-Match list; an etagc may contain commas, so no naive split. */
export function etagsIn(value: string): { weak: boolean; tag: string }[] {
  return [...value.matchAll(/(W\/)?("[^"]*")/g)].map((m) => ({ weak: m[1] !== undefined, tag: m[2] ?? "" }));
}

/** RFC 9110 §13.1.1: `*`, or any listed tag equal under strong comparison (a weak tag never matches). */
export function ifMatchSatisfied(value: string, current: StoredRecord): boolean {
  if (value.trim() === "*") return true;
  const etag = formatEtag(current.version);
  return etagsIn(value).some((t) => !t.weak && t.tag === etag);
}

export async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) throw new HttpProblem(413, "too-large", `the body is over ${MAX_BODY_BYTES} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString("utf8");
}

/** A request body as JSON: 400 when it is not JSON, 422 past 256 levels (what is stored is served and stringified again). */
export function parseJsonBody(text: string): unknown {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new HttpProblem(400, "malformed-json", "the body is not JSON");
  }
  if (jsonDepth(value, CANONICAL_MAX_DEPTH) > CANONICAL_MAX_DEPTH) throw new HttpProblem(422, "too-deep", `the body is nested deeper than ${CANONICAL_MAX_DEPTH} levels`);
  return value;
}

export async function readJson(req: IncomingMessage): Promise<unknown> {
  const text = await readBody(req);
  return text.trim() === "" ? {} : parseJsonBody(text);
}

export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
  method = "GET",
  contentType = "application/json",
): void {
  if (res.destroyed) return;
  const text = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": contentType,
    "content-length": Buffer.byteLength(text),
    "cache-control": "no-store",
    ...headers,
  });
  res.end(method === "HEAD" ? undefined : text);
}

/** A record's state as the body, its strong ETag as the validator: also the body of a 412, so a client can show the conflict. */
export function sendRecord(res: ServerResponse, status: number, record: StoredRecord, method = "GET"): void {
  sendJson(res, status, record.state, { etag: formatEtag(record.version) }, method);
}

/** RFC 9457 problem details. */
export function sendProblem(res: ServerResponse, status: number, slug: string, detail: string, method: string): void {
  const title = slug.replaceAll("-", " ");
  sendJson(res, status, { type: `urn:writ:demo-records:${slug}`, title, status, detail }, {}, method, "application/problem+json");
}
