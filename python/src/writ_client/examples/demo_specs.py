"""The demo's write tools (``examples/demo-tools.ts``) as a Python agent declares them.

The declarations must agree with the owner's (name, key scope, intent
fields): the owner recomputes every intent key from its own declaration. The
model names the record (``paymentId``, ``ticketId``); the owner validates the
params it declares and ignores that extra one, as with the TypeScript specs
in ``examples/demo-tool-specs.ts``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..keys import KeyedTool
from ..models import EntityRef, Versioned
from ..tools import WritToolSpec

__all__ = ["REFUND_PAYMENT", "TAG_TICKET", "RefundParams", "TagParams", "refund_spec", "tag_spec"]

REFUND_PAYMENT = KeyedTool(
    name="refund_payment",
    key_scope="run",
    intent_fields=("amountCents", "reason"),
    free_text_params=("note",),
    record_type="payment",
    description="Refund part or all of a payment.",
)

TAG_TICKET = KeyedTool(
    name="tag_ticket",
    key_scope="run",
    intent_fields=("tag",),
    record_type="ticket",
    description="Add a tag to a helpdesk ticket.",
)


class RefundParams(BaseModel):
    paymentId: str = Field(min_length=1, max_length=256, description="The payment to refund, e.g. pay_1001")
    amountCents: int = Field(gt=0)
    reason: Literal["damaged", "late", "duplicate_charge", "goodwill"]
    note: str | None = Field(default=None, max_length=500)


class TagParams(BaseModel):
    ticketId: str = Field(min_length=1, max_length=256, description="The ticket to tag, e.g. T-42")
    tag: str = Field(min_length=1, max_length=64)


def _refund_delta(p: RefundParams, current: Versioned) -> list[dict]:
    return [{"op": "add", "path": "/refunds/-", "value": {"amountCents": p.amountCents, "reason": p.reason}}]


def _tag_delta(p: TagParams, current: Versioned) -> list[dict]:
    state = current.state if isinstance(current.state, dict) else {}
    tags = [t for t in state.get("tags", []) if isinstance(t, str)]
    return [{"op": "replace", "path": "/tags", "value": tags if p.tag in tags else [*tags, p.tag]}]


refund_spec: WritToolSpec[RefundParams] = WritToolSpec(
    tool=REFUND_PAYMENT, params=RefundParams, entity=lambda p: EntityRef(type="payment", id=p.paymentId), delta=_refund_delta
)
tag_spec: WritToolSpec[TagParams] = WritToolSpec(tool=TAG_TICKET, params=TagParams, entity=lambda p: EntityRef(type="ticket", id=p.ticketId), delta=_tag_delta)
