"""The intent key and the params fingerprint, byte-identical to ``src/keys.ts``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .canonical import canonical_json, sha256_hex

__all__ = ["KEY_VERSION", "KeyScope", "KeyedTool", "MissingIntentField", "entity_key", "intent_key", "intent_key_material", "change_id", "lease_intent_key", "params_fingerprint", "undo_intent_key"]

#: ``v`` of the hashed object. A new version is a wire-contract change.
KEY_VERSION = 2

KeyScope = Literal["run", "global"]

_INTENT_KEY = re.compile(r"[0-9a-f]{64}")


class KeyedTool(BaseModel):
    """The part of a write tool's declaration the intent key depends on (the owner's declaration must agree).

    ``record_type``, ``free_text_params`` and ``description`` are not part of
    the key; they describe the tool to adapters.
    """

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1, max_length=128)
    key_scope: KeyScope
    intent_fields: tuple[str, ...]
    free_text_params: tuple[str, ...] = ()
    record_type: str | None = None
    description: str | None = None


class MissingIntentField(KeyError):
    """A declared intent field is not among the params."""


def entity_key(entity: Any) -> str:
    """``<type>:<id>``: the Kafka key of an entity (an ``EntityRef`` or a mapping with ``type`` and ``id``)."""
    if isinstance(entity, Mapping):
        return f"{entity['type']}:{entity['id']}"
    return f"{entity.type}:{entity.id}"


def intent_key_material(
    *, tool: KeyedTool, agent_id: str, run_id: str, step_id: str, entity: Any, params: Mapping[str, Any]
) -> dict[str, Any]:
    """The object whose canonical JSON is hashed: ``{v, scope, agent, run, step, tool, target, fields}``."""
    fields: dict[str, Any] = {}
    for name in tool.intent_fields:
        if name not in params:
            raise MissingIntentField(f'intent field "{name}" of tool {tool.name} is missing')
        fields[name] = params[name]
    run = tool.key_scope == "run"
    return {
        "v": KEY_VERSION,
        "scope": tool.key_scope,
        "agent": agent_id if run else None,
        "run": run_id if run else None,
        "step": step_id,
        "tool": tool.name,
        "target": entity_key(entity),
        "fields": fields,
    }


def intent_key(*, tool: KeyedTool, agent_id: str, run_id: str, step_id: str, entity: Any, params: Mapping[str, Any]) -> str:
    """sha256 (hex) over agent and run (scope ``run``), step, tool, target and the declared intent fields.

    Never free text, never a random id: every retry or resume of one business
    intent gets the same key. Byte-identical to TypeScript's ``intentKey()``;
    owners recompute it and refuse an intent whose key differs.
    """
    return sha256_hex(canonical_json(intent_key_material(tool=tool, agent_id=agent_id, run_id=run_id, step_id=step_id, entity=entity, params=params)))


def undo_intent_key(undone_key: str) -> str:
    """The intent key of the undo of the intent keyed ``undone_key``: sha256 (hex) of ``{"undo": <key>, "v": 2}``.

    Built from the undone key only (not agent, run or step), so every submission of one undo, by any agent, run or
    retry, is one intent. Byte-identical to TypeScript's ``undoIntentKey()`` (wire contract §5.7).
    """
    if not isinstance(undone_key, str) or not _INTENT_KEY.fullmatch(undone_key):
        raise ValueError(f"an intent key is 64 lower-case hex characters, got {undone_key!r:.80}")
    return sha256_hex(canonical_json({"v": KEY_VERSION, "undo": undone_key}))


def change_id(*, agent_id: str, run_id: str, step_id: str) -> str:
    """The id of a change that spans records: sha256 (hex) of ``{"change": {"agent", "run", "step"}, "v": 2}``.

    Stable across retries and resume, like an intent key. Byte-identical to TypeScript's ``changeId()`` (wire
    contract §5.8).
    """
    return sha256_hex(canonical_json({"v": KEY_VERSION, "change": {"agent": agent_id, "run": run_id, "step": step_id}}))


def lease_intent_key(change: str, op: Literal["acquire", "release"], entity: Any) -> str:
    """The intent key of a lease intent: sha256 (hex) of ``{"lease": <change id>, "op", "target": <entity key>, "v": 2}``.

    One key per change, operation and record. Byte-identical to TypeScript's ``leaseIntentKey()`` (wire contract §5.8).
    """
    if op not in ("acquire", "release"):
        raise ValueError(f'a lease intent\'s op is "acquire" or "release", got {op!r:.40}')
    return sha256_hex(canonical_json({"v": KEY_VERSION, "lease": change, "op": op, "target": entity_key(entity)}))


def params_fingerprint(tool: str, entity: Any, params: Mapping[str, Any], free_text_params: Sequence[str]) -> str:
    """sha256 over tool, entity and the params that are not free text (what the owner's key-reuse check compares)."""
    kept = {k: v for k, v in params.items() if k not in free_text_params}
    return sha256_hex(canonical_json({"tool": tool, "entity": entity_key(entity), "params": kept}))
