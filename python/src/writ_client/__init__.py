"""writ's agent side in Python: submit write intents to writ's owners on Kafka and read their replies.

The intent key and its canonical JSON are byte-identical to the TypeScript
implementation (``src/keys.ts``); see the wire contract in ``python/README.md``.
"""

from .canonical import CanonicalJsonError, canonical_json, js_number, sha256_hex
from .client import CONTROL_HEADER, ClientClosed, IntentInput, IntentRefused, ReplyStream, WritClient, create_input
from .change import ChangeApplied, ChangeCompensated, ChangeIncomplete, ChangeInput, ChangeNotStarted, ChangeResult, ChangeStep
from .codec import DecodeError, RegistryError, WireCodec
from .escalations import KIND_HEADER, RESOLUTION_FIELDS_BYTES, EscalationRecord, LedgerIntentEntry, ResolutionBounds, build_resolution, is_open, resolution_bounds, resolution_subject
from .keys import KEY_VERSION, KeyedTool, change_id, entity_key, intent_key, intent_key_material, lease_intent_key, params_fingerprint, undo_intent_key
from .models import (
    ABSENT_VERSION,
    LEDGER_VERSION,
    AppliedReply,
    BlockedOutcome,
    ConflictReply,
    EntityRef,
    Escalation,
    EscalatedReply,
    JsonPatchOp,
    NoReplyReason,
    RejectedReply,
    Reply,
    SubmitResult,
    UndoRef,
    UnknownOutcome,
    Versioned,
    WriteIntent,
    parse_reply,
)
from .partitioner import murmur2, partition_for
from .security import ConnectionSecurity, KafkaSecurity, RegistryAuth, RegistryTls, SecurityConfigError
from .signing import SIGNATURE_HEADER, AudienceInvalid, Ed25519Signer, IntentSigner, SigningError, check_audience, sign_intent, signed_bytes, verify_intent_signature

__version__ = "0.1.0"

__all__ = [
    "ABSENT_VERSION",
    "CONTROL_HEADER",
    "KEY_VERSION",
    "KIND_HEADER",
    "LEDGER_VERSION",
    "RESOLUTION_FIELDS_BYTES",
    "SIGNATURE_HEADER",
    "AppliedReply",
    "AudienceInvalid",
    "BlockedOutcome",
    "CanonicalJsonError",
    "ChangeApplied",
    "ChangeCompensated",
    "ChangeIncomplete",
    "ChangeInput",
    "ChangeNotStarted",
    "ChangeResult",
    "ChangeStep",
    "ClientClosed",
    "ConflictReply",
    "ConnectionSecurity",
    "DecodeError",
    "Ed25519Signer",
    "EntityRef",
    "Escalation",
    "EscalatedReply",
    "EscalationRecord",
    "IntentInput",
    "IntentRefused",
    "IntentSigner",
    "JsonPatchOp",
    "KafkaSecurity",
    "KeyedTool",
    "LedgerIntentEntry",
    "NoReplyReason",
    "RegistryAuth",
    "RegistryError",
    "RegistryTls",
    "RejectedReply",
    "Reply",
    "ReplyStream",
    "ResolutionBounds",
    "SecurityConfigError",
    "SigningError",
    "SubmitResult",
    "UndoRef",
    "UnknownOutcome",
    "Versioned",
    "WireCodec",
    "WritClient",
    "WriteIntent",
    "build_resolution",
    "canonical_json",
    "change_id",
    "check_audience",
    "create_input",
    "entity_key",
    "intent_key",
    "intent_key_material",
    "is_open",
    "js_number",
    "lease_intent_key",
    "murmur2",
    "params_fingerprint",
    "parse_reply",
    "partition_for",
    "resolution_bounds",
    "resolution_subject",
    "sha256_hex",
    "sign_intent",
    "signed_bytes",
    "undo_intent_key",
    "verify_intent_signature",
]
