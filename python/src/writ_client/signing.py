"""Intent signing: Ed25519 over the intent's canonical JSON, in the ``writ-signature`` header.

Owners that run with an agent registry (``WRIT_AGENT_REGISTRY``) accept only
signed intents (wire contract §7, ``docs/wire-contract.md``; TypeScript:
``src/security/signing.ts``):

* the signed bytes are the UTF-8 of the canonical JSON (RFC 8785, JCS:
  :func:`writ_client.canonical.canonical_json`) of the intent **as it is on
  the wire**, every member included;
* Ed25519 (RFC 8032), with a key the registry lists for the agent named in
  ``agent.id``;
* the header is ``writ-signature: ed25519 <key id> <base64 signature>``: key
  id 1 to 64 of ``A-Z a-z 0-9 . _ : -``, the 64-byte signature in standard
  base64 with padding;
* owners that set ``WRIT_SIGNING_AUDIENCE`` admit a signed intent or
  resolution only when its ``audience`` member (signed with the rest) is
  theirs: :func:`check_audience` checks a client's ``audience=``.

The golden vectors in ``test/fixtures/signature-vectors.json`` (written by
``scripts/generate-signature-vectors.ts``) pin the bytes for both languages.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .canonical import canonical_json

__all__ = [
    "SIGNATURE_HEADER",
    "AudienceInvalid",
    "Ed25519Signer",
    "IntentSigner",
    "SigningError",
    "check_audience",
    "public_key_from",
    "sign_intent",
    "signed_bytes",
    "verify_intent_signature",
]

#: The record header carrying an intent's signature.
SIGNATURE_HEADER = "writ-signature"

# Matched with fullmatch: `$` would also match before a trailing newline.
_KEY_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_SIGNATURE_B64 = re.compile(r"[A-Za-z0-9+/]{86}==")
#: An ``audience``: 1 to 128 of ``A-Z a-z 0-9 . _ : / -`` (TypeScript's ``Audience``, src/schemas/common.ts).
_AUDIENCE = re.compile(r"[A-Za-z0-9._:/-]{1,128}")


class SigningError(ValueError):
    """A signer that cannot sign: a bad key id, key material that is not an Ed25519 private key.

    The message names what is wrong, never the key material.
    """


class AudienceInvalid(SigningError):
    """A client's ``audience=`` that cannot be used (TypeScript's ``config_invalid`` naming the field ``audience``): not
    1 to 128 of ``A-Z a-z 0-9 . _ : / -``, or given without a signer (owners check the audience of signed records only,
    so an unsigned one protects nothing)."""

    code = "config_invalid"
    field = "audience"


def check_audience(audience: object, *, has_signer: bool) -> str | None:
    """``audience`` checked for a client that signs (``has_signer``); None stays None.

    The deployment the client signs for: its owners' ``WRIT_SIGNING_AUDIENCE``. Put in every intent and resolution it
    signs, so that owners of another deployment listing the same key refuse them (``unauthenticated``).
    """
    if audience is None:
        return None
    if not isinstance(audience, str) or not _AUDIENCE.fullmatch(audience):
        shown = repr(audience[:64]) if isinstance(audience, str) else type(audience).__name__
        raise AudienceInvalid(f"audience must be 1–128 of A-Z a-z 0-9 . _ : / -, got {shown}")
    if not has_signer:
        raise AudienceInvalid("audience needs a signer (signer=): owners check the audience of signed records only, so an unsigned one protects nothing")
    return audience


@runtime_checkable
class IntentSigner(Protocol):
    """What :class:`~writ_client.WritClient` signs intents with: a key id the owners' agent registry knows, and Ed25519.

    :class:`Ed25519Signer` is the implementation; anything with ``key_id`` and
    ``sign(data) -> 64-byte Ed25519 signature`` (a KMS or HSM wrapper) works too.
    """

    key_id: str

    def sign(self, data: bytes) -> bytes: ...


def _check_key_id(key_id: Any) -> str:
    if not isinstance(key_id, str) or _KEY_ID.fullmatch(key_id) is None:
        raise SigningError("signing key id must be 1–64 of A-Z a-z 0-9 . _ : -")
    return key_id


def _seed_bytes(seed: bytes | str) -> bytes:
    if isinstance(seed, str):
        try:
            seed = base64.b64decode(seed.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise SigningError("an Ed25519 seed is 32 raw bytes, or those bytes in base64") from None
    if len(seed) != 32:
        raise SigningError("an Ed25519 seed is 32 raw bytes, or those bytes in base64")
    return bytes(seed)


class Ed25519Signer:
    """An agent's Ed25519 signing key and the key id the agent registry knows its public key by.

    Build one from a PKCS#8 PEM private key (what ``openssl genpkey -algorithm
    ed25519`` and Node's ``generateKeyPairSync("ed25519")`` export), or from the
    32-byte seed (raw or base64)::

        signer = Ed25519Signer.from_pem_file("/run/secrets/agent.key.pem", key_id="2026-11")
        signer = Ed25519Signer.from_seed(os.environ["WRIT_SIGNING_SEED"], key_id="2026-11")

    The registry entry takes :meth:`public_key_pem` or :meth:`public_key_base64`.
    Its ``repr`` shows the key id and the public key, never the private key.
    """

    __slots__ = ("_key", "key_id")

    def __init__(self, key_id: str, private_key: Ed25519PrivateKey) -> None:
        if not isinstance(private_key, Ed25519PrivateKey):
            raise SigningError("signing key must be an Ed25519 private key")
        self.key_id = _check_key_id(key_id)
        self._key = private_key

    @classmethod
    def from_pem(cls, pem: str | bytes, *, key_id: str, password: str | bytes | None = None) -> Ed25519Signer:
        """From PEM text of a PKCS#8 Ed25519 private key (``password`` for an encrypted one)."""
        data = pem.encode("utf-8") if isinstance(pem, str) else bytes(pem)
        pw = password.encode("utf-8") if isinstance(password, str) else password
        try:
            key = serialization.load_pem_private_key(data, password=pw)
        except (ValueError, TypeError) as err:
            # The library's message says what is wrong (encrypted, no PEM block), not the key.
            raise SigningError(f"not a readable PEM private key: {err}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise SigningError(f"signing key must be an Ed25519 private key, not {type(key).__name__}")
        return cls(key_id, key)

    @classmethod
    def from_pem_file(cls, path: str | os.PathLike[str], *, key_id: str, password: str | bytes | None = None) -> Ed25519Signer:
        """From a file holding a PKCS#8 Ed25519 private key in PEM."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as err:
            raise SigningError(f"cannot read the signing key file {os.fspath(path)}: {err.strerror or err}") from None
        return cls.from_pem(data, key_id=key_id, password=password)

    @classmethod
    def from_seed(cls, seed: bytes | str, *, key_id: str) -> Ed25519Signer:
        """From the 32-byte Ed25519 seed (RFC 8032's private key), raw or in base64."""
        return cls(key_id, Ed25519PrivateKey.from_private_bytes(_seed_bytes(seed)))

    @classmethod
    def generate(cls, *, key_id: str) -> Ed25519Signer:
        """A new random key (tests, first setup); keep :meth:`private_key_pem` somewhere safe."""
        return cls(key_id, Ed25519PrivateKey.generate())

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data``."""
        return self._key.sign(data)

    def header(self, intent: Mapping[str, Any]) -> str:
        """The ``writ-signature`` header value for ``intent`` (a JSON object as sent): :func:`sign_intent`."""
        return sign_intent(intent, self)

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self._key.public_key()

    def public_key_pem(self) -> str:
        """The public key as SPKI PEM, for the agent registry."""
        return self.public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode("ascii")

    def public_key_base64(self) -> str:
        """The public key as its 32 raw bytes in base64, for the agent registry."""
        raw = self.public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.b64encode(raw).decode("ascii")

    def private_key_pem(self, password: str | bytes | None = None) -> str:
        """The private key as PKCS#8 PEM (encrypted with ``password`` when given). A secret: never log it."""
        enc: serialization.KeySerializationEncryption
        if password:
            enc = serialization.BestAvailableEncryption(password.encode("utf-8") if isinstance(password, str) else password)
        else:
            enc = serialization.NoEncryption()
        return self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc).decode("ascii")

    def __repr__(self) -> str:
        return f"Ed25519Signer(key_id={self.key_id!r}, public_key={self.public_key_base64()!r})"

    def __reduce__(self) -> Any:
        # Pickling would copy the private key into wherever the pickle goes (a log, a cache): refuse.
        raise TypeError("an Ed25519Signer is not picklable (it holds a private key)")


def signed_bytes(intent: Any) -> bytes:
    """The bytes an intent's signature covers: the UTF-8 of its canonical JSON (RFC 8785).

    Raises :class:`~writ_client.canonical.CanonicalJsonError` (``not_canonical``,
    ``input_too_deep``) for a value with no canonical form: such an intent
    cannot be signed, and owners refuse it.
    """
    return canonical_json(intent).encode("utf-8")


def sign_intent(intent: Any, signer: IntentSigner) -> str:
    """The ``writ-signature`` header value for ``intent`` (the JSON object as sent), signed by ``signer``.

    ``ed25519 <key id> <base64 of the 64-byte signature>``, as TypeScript's ``signIntent``.
    """
    key_id = _check_key_id(getattr(signer, "key_id", None))
    signature = signer.sign(signed_bytes(intent))
    if not isinstance(signature, (bytes, bytearray)) or len(signature) != 64:
        raise SigningError("the signer did not return a 64-byte Ed25519 signature")
    return f"ed25519 {key_id} {base64.b64encode(bytes(signature)).decode('ascii')}"


def public_key_from(text: str) -> Ed25519PublicKey:
    """An Ed25519 public key from SPKI PEM text or its 32 raw bytes in base64 (the agent registry's two forms)."""
    trimmed = text.strip()
    if trimmed.startswith("-----BEGIN"):
        key = serialization.load_pem_public_key(trimmed.encode("ascii"))
        if not isinstance(key, Ed25519PublicKey):
            raise SigningError("not an Ed25519 public key")
        return key
    try:
        raw = base64.b64decode(trimmed, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise SigningError("an Ed25519 public key is PEM or 32 raw bytes in base64")
    return Ed25519PublicKey.from_public_bytes(raw)


def verify_intent_signature(intent: Any, header: str | None, keys: Mapping[str, Ed25519PublicKey]) -> tuple[bool, str]:
    """Checks a ``writ-signature`` header as owners do: ``(True, key id)`` or ``(False, reason)``.

    ``keys``: key id → public key (see :func:`public_key_from`).
    """
    if header is None:
        return False, "the intent is not signed (no writ-signature header)"
    if len(header) > 256:
        return False, "the signature header is too long"
    parts = header.split(" ")
    if len(parts) != 3 or parts[0] != "ed25519":
        return False, "the signature header is not `ed25519 <key id> <base64>`"
    key = keys.get(parts[1])
    if key is None:
        return False, f"key {parts[1][:64]} is not registered for this agent"
    if _SIGNATURE_B64.fullmatch(parts[2]) is None:
        return False, "an Ed25519 signature is 64 bytes in padded base64"
    try:
        data = signed_bytes(intent)
    except ValueError as err:
        return False, f"the intent has no canonical form, so no signature can cover it: {err}"[:1000]
    try:
        key.verify(base64.b64decode(parts[2]), data)
    except InvalidSignature:
        return False, "the signature does not match the intent"
    return True, parts[1]
