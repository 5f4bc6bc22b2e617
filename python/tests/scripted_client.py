"""A stand-in for :class:`~writ_client.WritClient` in the adapters' unit tests: the real intent key, every submit
kept and answered ``applied``; no broker."""

from __future__ import annotations

from typing import Any

from writ_client import AppliedReply
from writ_client.keys import intent_key


class AppliedClient:
    agent_id = "agent-unit"

    def __init__(self) -> None:
        self.submitted: list[Any] = []

    def intent_key(self, **kw: Any) -> str:
        return intent_key(agent_id=self.agent_id, **kw)

    async def asubmit(self, intent: Any, *, timeout: float | None = None) -> AppliedReply:
        self.submitted.append(intent)
        return AppliedReply.model_validate(
            {
                "status": "applied",
                "intentId": f"i{len(self.submitted)}",
                "intentKey": "k" * 64,
                "duplicate": False,
                "at": "2026-12-06T00:00:00.000Z",
                "entity": intent.entity.model_dump(),
                "state": {"refunds": [{"amountCents": 1}]},
                "version": '"v2"',
                "via": "patch",
            }
        )


class CountingReader:
    """A record reader that counts its reads."""

    def __init__(self) -> None:
        self.reads: list[Any] = []

    def __call__(self, entity: Any) -> dict[str, Any]:
        self.reads.append(entity)
        return {"state": {"refunds": []}, "version": '"v1"'}
