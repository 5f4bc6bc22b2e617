"""The codec against TypeScript's: the same schema text and id, and values TypeScript decodes."""

from __future__ import annotations

import base64
import json
import subprocess
import uuid

from writ_client import EntityRef, IntentInput, KeyedTool, WireCodec, WritClient, parse_reply
from writ_client.codec import schema_text
from writ_client.devstack import Stack, node_binary

from .conftest import REPO

# Reads {"topic", "framed", "plain"} on stdin; registers WriteIntent for the topic with TypeScript's WireCodec and
# decodes both values with it.
TS_SCRIPT = """
import { WireCodec } from "./src/codec.ts";
import { jsonSchemaOf } from "./src/json-schema.ts";
let input = "";
for await (const chunk of process.stdin) input += chunk;
const { topic, framed, plain, registry, intent } = JSON.parse(input);
const codec = new WireCodec({ schemaRegistryUrl: registry });
const encoded = await codec.encode(topic, "WriteIntent", intent);
const subject = `${topic}-value`;
const decode = async (b64) => {
  const r = await codec.decode("WriteIntent", Buffer.from(b64, "base64"), { subject });
  return r.ok ? { ok: true, framed: r.framed, value: r.value } : { ok: false, reason: r.reason, message: r.message };
};
console.log(JSON.stringify({
  tsId: encoded.readInt32BE(1),
  schemas: Object.fromEntries(["WriteIntent", "Reply", "Resolution", "Escalation"].map((n) => [n, JSON.stringify(jsonSchemaOf(n))])),
  framed: await decode(framed),
  plain: await decode(plain),
}));
"""

TOOL = KeyedTool(name="refund_payment", key_scope="run", intent_fields=("amountCents", "reason"), free_text_params=("note",))


def test_packaged_schemas_are_the_repository_ones() -> None:
    for name in ("WriteIntent", "Reply", "Resolution", "Escalation"):
        packaged = json.loads((REPO / "python" / "src" / "writ_client" / "schemas" / f"{name}.json").read_text("utf-8"))
        assert packaged == json.loads((REPO / "schemas" / f"{name}.json").read_text("utf-8")), f"python/src/writ_client/schemas/{name}.json drifted from schemas/{name}.json: copy it"


def test_typescript_decodes_python_values_and_registers_the_same_schema(stack: Stack) -> None:
    if not stack.registry_url:
        import pytest

        pytest.skip("no schema registry")
    topic = f"writ.intents.py-codec-{uuid.uuid4().hex[:8]}"
    # A client that is never started: build_intent and the codec need no broker.
    c = WritClient(brokers=stack.brokers, agent_id="py-codec", reply_topic="writ.replies.py-codec", intents_topic=topic, schema_registry_url=stack.registry_url)
    intent = c.build_intent(
        IntentInput(
            tool=TOOL, entity=EntityRef(type="payment", id="pay_é漢字😀"), run_id="run-1", step_id="s1", base_version='"v1"',
            delta=[{"op": "add", "path": "/refunds/-", "value": {"amountCents": 100.0, "reason": "damaged", "x": [1e21, -0.0, 1.5e-7]}}],
            params={"amountCents": 100, "reason": "damaged", "note": "naïve \ud83d\ude00 \u2028"},
        )
    )
    wire = intent.to_wire()
    framed = c.codec.encode(topic, "WriteIntent", wire)
    plain = WireCodec(None).encode(topic, "WriteIntent", wire)
    payload = {"topic": topic, "registry": stack.registry_url, "intent": wire, "framed": base64.b64encode(framed).decode(), "plain": base64.b64encode(plain).decode()}
    out = subprocess.run(
        [node_binary(REPO), "--input-type=module", "-e", TS_SCRIPT], cwd=REPO, input=json.dumps(payload), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-3000:]
    ts = json.loads(out.stdout.strip().split("\n")[-1])  # not splitlines(): the JSON holds a raw U+2028
    for name in ("WriteIntent", "Reply", "Resolution", "Escalation"):
        assert schema_text(name) == ts["schemas"][name], name
    # One schema version for the subject, whichever client registered first.
    assert int.from_bytes(framed[1:5], "big", signed=True) == ts["tsId"]
    assert ts["framed"]["ok"] and ts["framed"]["framed"], ts["framed"]
    assert ts["plain"]["ok"] and not ts["plain"]["framed"], ts["plain"]
    assert ts["framed"]["value"]["intentKey"] == intent.intent_key
    assert ts["plain"]["value"]["params"]["note"] == "naïve 😀 \u2028"


def test_replies_decode_plain_and_framed(stack: Stack) -> None:
    reply = {
        "status": "applied", "intentId": "i1", "intentKey": "0" * 64, "duplicate": False, "at": "2026-01-01T00:00:00.000Z",
        "entity": {"type": "payment", "id": "p1"}, "state": {"refunds": []}, "version": '"v2"', "via": "patch", "futureField": 1,
    }
    plain = WireCodec(None)
    assert parse_reply(plain.decode(json.dumps(reply).encode())).version == '"v2"'
    if stack.registry_url:
        codec = WireCodec(stack.registry_url)
        data = codec.encode(f"writ.replies.py-codec-{uuid.uuid4().hex[:8]}", "Reply", reply)
        parsed = parse_reply(codec.decode(data))
        assert parsed.status == "applied" and parsed.model_extra == {"futureField": 1}
