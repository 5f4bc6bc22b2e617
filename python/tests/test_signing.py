"""Intent signing: the golden vectors of test/fixtures/signature-vectors.json (shared with the TypeScript suite), the signer's key forms, and what the client signs."""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from writ_client import (
    SIGNATURE_HEADER,
    AudienceInvalid,
    CanonicalJsonError,
    Ed25519Signer,
    EntityRef,
    IntentInput,
    KeyedTool,
    SigningError,
    WritClient,
    WriteIntent,
    build_resolution,
    canonical_json,
    sign_intent,
    signed_bytes,
    verify_intent_signature,
)
from writ_client.change import build_lease_intent
from writ_client.signing import public_key_from

from .conftest import REPO

VECTORS = json.loads((REPO / "test" / "fixtures" / "signature-vectors.json").read_text("utf-8"))
KEYS = {k["keyId"]: k for k in VECTORS["keys"]}
REFUND = KeyedTool(name="refund_payment", key_scope="run", intent_fields=("amountCents", "reason"), free_text_params=("note",))


def test_the_file_names_the_header_and_the_algorithm() -> None:
    assert VECTORS["header"] == SIGNATURE_HEADER == "writ-signature"
    assert VECTORS["algorithm"] == "ed25519"
    assert sum("error" not in v["expected"] for v in VECTORS["vectors"]) >= 6
    assert sum("error" in v["expected"] for v in VECTORS["vectors"]) >= 2


def test_rfc8032_test_1_as_the_rfc_prints_it() -> None:
    # The values as published in RFC 8032 section 7.1, not computed here.
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    public = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    signature = "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
    assert VECTORS["rfc8032"]["signatureHex"] == signature and VECTORS["rfc8032"]["publicKeyHex"] == public
    signer = Ed25519Signer.from_seed(seed, key_id="rfc")
    assert signer.sign(b"").hex() == signature
    assert base64.b64decode(signer.public_key_base64()).hex() == public


@pytest.mark.parametrize("k", VECTORS["keys"], ids=[k["keyId"] for k in VECTORS["keys"]])
def test_every_key_form_is_the_same_key(k: dict[str, Any]) -> None:
    from_seed = Ed25519Signer.from_seed(k["seedBase64"], key_id=k["keyId"])
    from_raw_seed = Ed25519Signer.from_seed(base64.b64decode(k["seedBase64"]), key_id=k["keyId"])
    from_pem = Ed25519Signer.from_pem(k["privateKeyPem"], key_id=k["keyId"])
    for s in (from_seed, from_raw_seed, from_pem):
        assert s.public_key_pem() == k["publicKeyPem"]
        assert s.public_key_base64() == k["publicKeyBase64"]
    assert from_seed.private_key_pem() == k["privateKeyPem"]  # PKCS#8, byte for byte as Node exports it


@pytest.mark.parametrize("v", VECTORS["vectors"], ids=[v["name"] for v in VECTORS["vectors"]])
def test_vector(v: dict[str, Any]) -> None:
    k = KEYS[v["keyId"]]
    signer = Ed25519Signer.from_pem(k["privateKeyPem"], key_id=k["keyId"])
    intent = json.loads(v["intentJson"])
    expected = v["expected"]
    if "error" in expected:
        for compute in (lambda: signed_bytes(intent), lambda: sign_intent(intent, signer), lambda: signer.header(intent)):
            with pytest.raises(CanonicalJsonError) as err:
                compute()
            assert err.value.code == expected["error"]
        ok, reason = verify_intent_signature(intent, f"ed25519 {k['keyId']} {'A' * 86}==", {k["keyId"]: public_key_from(k["publicKeyPem"])})
        assert not ok and "no canonical form" in reason
        return
    assert canonical_json(intent) == expected["canonical"]
    assert signed_bytes(intent) == expected["canonical"].encode("utf-8")
    assert sign_intent(intent, signer) == expected["header"]
    assert Ed25519Signer.from_seed(k["seedBase64"], key_id=k["keyId"]).header(intent) == expected["header"]
    for pub in (k["publicKeyPem"], k["publicKeyBase64"]):
        assert verify_intent_signature(intent, expected["header"], {k["keyId"]: public_key_from(pub)}) == (True, k["keyId"])
    changed = {**intent, "baseVersion": '"v4"'}
    assert verify_intent_signature(changed, expected["header"], {k["keyId"]: public_key_from(k["publicKeyPem"])}) == (False, "the signature does not match the intent")


def test_the_wire_form_of_the_model_signs_as_the_vectors() -> None:
    """A WriteIntent model's to_wire() (what the client sends and signs) has the vectors' canonical bytes and signature."""
    checked = 0
    for v in VECTORS["vectors"]:
        if "error" in v["expected"]:
            continue
        raw = json.loads(v["intentJson"])
        try:
            model = WriteIntent.model_validate(raw)
        except ValueError:
            assert "futureField" in raw  # only the vector with a member the model does not declare
            continue
        k = KEYS[v["keyId"]]
        wire = model.to_wire()
        assert canonical_json(wire) == v["expected"]["canonical"], v["name"]
        assert sign_intent(wire, Ed25519Signer.from_seed(k["seedBase64"], key_id=k["keyId"])) == v["expected"]["header"], v["name"]
        checked += 1
    assert checked >= 5


def test_key_ids_and_key_material_are_checked_without_showing_the_key(tmp_path: Path) -> None:
    for bad in ("", "has space", "x" * 65, "ünïcode", "a/b"):
        with pytest.raises(SigningError, match="key id"):
            Ed25519Signer.generate(key_id=bad)
    for ok in ("k1", "2026-11", "a.b_c:d-e", "x" * 64):
        assert Ed25519Signer.generate(key_id=ok).key_id == ok
    with pytest.raises(SigningError, match="32 raw bytes"):
        Ed25519Signer.from_seed(b"\x01" * 31, key_id="k")
    with pytest.raises(SigningError, match="32 raw bytes"):
        Ed25519Signer.from_seed("not base64!!", key_id="k")
    # Not Ed25519: an EC key
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(SigningError, match="must be an Ed25519 private key"):
        Ed25519Signer.from_pem(ec_pem, key_id="k")
    with pytest.raises(SigningError, match="cannot read the signing key file"):
        Ed25519Signer.from_pem_file(tmp_path / "missing.pem", key_id="k")
    # An encrypted PKCS#8 file, with and without its password; the error never carries the key
    signer = Ed25519Signer.generate(key_id="k")
    secret_pem = signer.private_key_pem(password="pw-123")
    path = tmp_path / "agent.key.pem"
    path.write_text(secret_pem)
    assert Ed25519Signer.from_pem_file(path, key_id="k", password="pw-123").public_key_pem() == signer.public_key_pem()
    with pytest.raises(SigningError) as err:
        Ed25519Signer.from_pem_file(path, key_id="k")
    assert "PRIVATE KEY" not in str(err.value)
    plain = signer.private_key_pem()
    assert plain.splitlines()[1] not in repr(signer) and "k" in repr(signer)
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(signer)


def test_any_object_with_a_key_id_and_sign_is_a_signer() -> None:
    key = Ed25519PrivateKey.generate()

    class KmsSigner:
        key_id = "kms-1"

        def sign(self, data: bytes) -> bytes:
            return key.sign(data)

    intent = json.loads(VECTORS["vectors"][0]["intentJson"])
    header = sign_intent(intent, KmsSigner())
    assert header.startswith("ed25519 kms-1 ")
    assert verify_intent_signature(intent, header, {"kms-1": key.public_key()}) == (True, "kms-1")

    class Broken:
        key_id = "k"

        def sign(self, data: bytes) -> bytes:
            return b"short"

    with pytest.raises(SigningError, match="64-byte"):
        sign_intent(intent, Broken())


def test_verification_bounds_a_hostile_header() -> None:
    k = KEYS["test-2026-11"]
    keys = {k["keyId"]: public_key_from(k["publicKeyBase64"])}
    intent = json.loads(VECTORS["vectors"][0]["intentJson"])
    good = VECTORS["vectors"][0]["expected"]["header"]
    assert verify_intent_signature(intent, None, keys)[1].startswith("the intent is not signed")
    assert "too long" in verify_intent_signature(intent, "x" * 257, keys)[1]
    assert "is not `ed25519" in verify_intent_signature(intent, good.replace("ed25519", "rsa"), keys)[1]
    assert "not registered" in verify_intent_signature(intent, good.replace(k["keyId"], "other"), keys)[1]
    assert "padded base64" in verify_intent_signature(intent, good[:-2], keys)[1]
    assert verify_intent_signature(intent, good, keys)[0] is True
    # As TypeScript's verifier: nothing after the padding, a newline neither.
    assert verify_intent_signature(intent, good + "\n", keys) == (False, "an Ed25519 signature is 64 bytes in padded base64")


def test_a_key_id_ending_in_a_newline_is_refused() -> None:
    for key_id in ("k1\n", "k1\r\n", "\nk1"):
        with pytest.raises(SigningError, match="key id"):
            Ed25519Signer.from_seed(bytes(32), key_id=key_id)


def _client(**kw: Any) -> WritClient:
    return WritClient(brokers="127.0.0.1:1", agent_id="billing-agent", reply_topic="writ.replies.billing-agent", **kw)


def _input(**over: Any) -> IntentInput:
    base: dict[str, Any] = dict(
        tool=REFUND,
        entity=EntityRef(type="payment", id="pay_1001"),
        run_id="run-42",
        step_id="once-per-run",
        base_version='"v3"',
        delta=[{"op": "add", "path": "/refunds/-", "value": {"amountCents": 5000, "reason": "damaged"}}],
        params={"amountCents": 5000, "reason": "damaged", "note": "box crushed"},
    )
    base.update(over)
    return IntentInput(**base)


def test_the_client_signs_the_object_it_sends() -> None:
    signer = Ed25519Signer.from_seed(KEYS["test-2026-11"]["seedBase64"], key_id="test-2026-11")
    client = _client(signer=signer)
    intent = client.build_intent(_input())
    wire, headers = client._prepare(intent)
    assert headers and headers[0][0] == SIGNATURE_HEADER
    # What the owner parses from the value is what the signature covers.
    sent = json.loads(client.codec.encode(client.intents_topic, "WriteIntent", wire))
    assert verify_intent_signature(sent, headers[0][1], {"test-2026-11": signer.public_key}) == (True, "test-2026-11")
    assert _client()._prepare(intent)[1] == []  # no signer: no header


def test_a_signer_must_look_like_one() -> None:
    with pytest.raises(TypeError, match="key_id"):
        _client(signer=object())

    class BadId:
        key_id = "has space"

        def sign(self, data: bytes) -> bytes:
            return b""

    with pytest.raises(SigningError, match="key id"):
        _client(signer=BadId())


@pytest.mark.parametrize(
    ("over", "where"),
    [
        ({"params": {"amountCents": 5000, "reason": "damaged", "note": "broken \ud800 text"}}, "/params/note"),
        ({"params": {"amountCents": 5000, "reason": "damaged", "note": float("nan")}}, "/params/note"),
        ({"delta": [{"op": "replace", "path": "/limit", "value": float("inf")}]}, "/delta/0/value"),
        ({"delta": [{"op": "replace", "path": "/limit", "value": {"\udc00": 1}}]}, "the key at '/delta/0/value/\\udc00'"),
        ({"params": {"amountCents": 5000, "reason": "damaged", "note": [1, -float("inf")]}}, "/params/note/1"),
    ],
)
def test_values_with_no_canonical_form_are_refused_before_sending(over: dict[str, Any], where: str) -> None:
    """Free text and the delta are not in the key, so build_intent() passes; what would go on the wire is refused."""
    client = _client(signer=Ed25519Signer.generate(key_id="k1"))
    intent = client.build_intent(_input(**over))
    with pytest.raises(CanonicalJsonError) as err:
        client._prepare(intent)
    assert err.value.code == "not_canonical"
    assert where in str(err.value) and intent.intent_id in str(err.value)
    assert "owners refuse" in str(err.value)


def test_an_intent_field_with_no_canonical_form_is_refused_when_building() -> None:
    with pytest.raises(CanonicalJsonError) as err:
        _client().build_intent(_input(params={"amountCents": float("nan"), "reason": "damaged"}))
    assert err.value.code == "not_canonical"


# -- the audience (the owners' WRIT_SIGNING_AUDIENCE, wire contract §7) -----------------------------------------------

AUDIENCE_VECTOR = next(v for v in VECTORS["vectors"] if v["name"].startswith("audience:"))


def test_the_audience_vector_covers_the_audience() -> None:
    """The audience is one more signed member: the vector verifies, and the same bytes under another audience (or none) do not."""
    k = KEYS[AUDIENCE_VECTOR["keyId"]]
    intent = json.loads(AUDIENCE_VECTOR["intentJson"])
    assert intent["audience"] == "acme:billing/prod-eu-1"
    header = AUDIENCE_VECTOR["expected"]["header"]
    keys = {k["keyId"]: public_key_from(k["publicKeyPem"])}
    assert sign_intent(intent, Ed25519Signer.from_seed(k["seedBase64"], key_id=k["keyId"])) == header
    assert verify_intent_signature(intent, header, keys) == (True, k["keyId"])
    assert verify_intent_signature({**intent, "audience": "acme:billing/staging"}, header, keys)[0] is False
    assert verify_intent_signature({m: x for m, x in intent.items() if m != "audience"}, header, keys)[0] is False
    # The model keeps it (it would otherwise refuse the member, or drop it and break the signature).
    assert canonical_json(WriteIntent.model_validate(intent).to_wire()) == AUDIENCE_VECTOR["expected"]["canonical"]


def test_an_audience_needs_a_signer_and_the_alphabet() -> None:
    with pytest.raises(AudienceInvalid, match="needs a signer") as err:
        _client(audience="prod")
    assert err.value.code == "config_invalid" and err.value.field == "audience"
    signer = Ed25519Signer.generate(key_id="k1")
    for bad in ("", "x" * 129, "prod eu", "prod\x1b[2J", 7):
        with pytest.raises(AudienceInvalid, match="1–128"):
            _client(signer=signer, audience=bad)
    assert _client(signer=signer, audience="a" * 128).audience == "a" * 128
    assert _client(signer=signer).audience is None


def test_the_client_signs_its_audience_into_every_intent_and_resolution() -> None:
    signer = Ed25519Signer.from_seed(KEYS["test-2026-11"]["seedBase64"], key_id="test-2026-11")
    keys = {"test-2026-11": signer.public_key}
    client = _client(signer=signer, audience="acme:billing/prod-eu-1")
    built = client.build_intent(_input())
    assert built.audience == "acme:billing/prod-eu-1"
    undo = client.build_undo({"intent_key": "a" * 64, "entity": {"type": "payment", "id": "pay_1001"}, "tool": "refund_payment"})
    lease = build_lease_intent(
        change="b" * 64, op="acquire", entity=EntityRef(type="payment", id="pay_1001"), tool="refund_payment", agent_id="billing-agent", run_id="r", step_id="s", reply_to="writ.replies.billing-agent"
    )
    for intent in (built, undo, lease):
        stamped = client._with_audience(intent)
        wire, headers = client._prepare(stamped)
        assert wire["audience"] == "acme:billing/prod-eu-1"
        sent = json.loads(client.codec.encode(client.intents_topic, "WriteIntent", wire))
        assert verify_intent_signature(sent, headers[0][1], keys) == (True, "test-2026-11")
        assert verify_intent_signature({**sent, "audience": "acme:billing/staging"}, headers[0][1], keys)[0] is False
    with pytest.raises(AudienceInvalid, match="not this client's"):
        client._with_audience(built.model_copy(update={"audience": "staging"}))
    # Without an audience nothing is added (the member stays off the wire).
    plain = _client(signer=signer)
    assert "audience" not in plain._prepare(plain._with_audience(plain.build_intent(_input())))[0]
    wire = build_resolution(
        {"escalationId": "esc-1", "reason": "conflict_cycles_exhausted", "message": "m", "intent": built.to_wire(), "cycles": 2, "current": None, "at": "2026-11-05T10:15:30.123Z"},
        "discard",
        operator="billing-agent",
        reply_to="writ.replies.billing-agent",
        audience="acme:billing/prod-eu-1",
    )
    assert wire["audience"] == "acme:billing/prod-eu-1"
    header = sign_intent(wire, signer)
    assert verify_intent_signature(wire, header, keys)[0] is True
    assert verify_intent_signature({**wire, "audience": "staging"}, header, keys)[0] is False


def test_from_env_takes_the_owners_audience_for_a_signing_client() -> None:
    signer = Ed25519Signer.generate(key_id="k1")
    env = {"KAFKA_BROKERS": "127.0.0.1:1", "WRIT_SIGNING_AUDIENCE": "prod"}
    assert WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env=env, signer=signer).audience == "prod"
    assert WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env=env, signer=signer, audience="staging").audience == "staging"
    # Not signing: nothing to bind it to, and the owners' variable may share the environment.
    assert WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env=env).audience is None
    # Read as owners read it: a value they refuse (" prod") is refused naming the variable, never trimmed into another.
    with pytest.raises(AudienceInvalid, match="WRIT_SIGNING_AUDIENCE"):
        WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env={**env, "WRIT_SIGNING_AUDIENCE": " prod"}, signer=signer)
