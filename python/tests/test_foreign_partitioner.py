"""A foreign producer on its defaults: confluent-kafka (librdkafka) with no partitioner set.

librdkafka's default partitioner is ``consistent_random`` (CRC32 of the key), not
the murmur2 that Java and kafkajs use, so an intent keyed ``payment:<id>`` often
lands on another partition than its owner's. Owners forward such a record to its
key's partition in their own transaction; each intent must still be written
exactly once (counted at the records server, whose own Idempotency-Key dedupe is
off), also when the producer sends it twice.
"""

from __future__ import annotations

import json
import time
import zlib
from typing import Any

from confluent_kafka import Producer

from writ_client import AppliedReply, WritClient, partition_for
from writ_client.devstack import RecordsAdmin, Stack

from .conftest import INTENT_PARTITIONS, owner_metric
from .test_client import refund_input, seed_payment


def crc32_partition(key: str, partitions: int) -> int:
    """librdkafka's consistent_random for a non-empty key: CRC32 of the key bytes, modulo the partition count."""
    return (zlib.crc32(key.encode("utf-8")) & 0xFFFFFFFF) % partitions


def test_a_librdkafka_default_partitioner_writes_once_per_intent(stack: Stack, topics: dict[str, str], client: WritClient, records: RecordsAdmin, owner: Any, uid: str) -> None:
    # Payments whose key CRC32 puts on another partition than murmur2: the case that gave a record two owners.
    ids = [f"pay_{uid}_{n}" for n in range(60)]
    moved = [pid for pid in ids if crc32_partition(f"payment:{pid}", INTENT_PARTITIONS) != partition_for(f"payment:{pid}", INTENT_PARTITIONS)][:8]
    assert len(moved) >= 4, "expected keys that the two partitioners place differently"
    intents = []
    for pid in moved:
        seeded = seed_payment(records, pid)
        intents.append(client.build_intent(refund_input(pid, seeded["version"], run=f"run-{uid}")))

    replies: dict[str, list[Any]] = {}
    stream = client.replies(idle_timeout=60)  # registered before anything is sent: no reply can slip past it
    foreign = Producer({"bootstrap.servers": stack.brokers, "enable.idempotence": True})  # no partitioner: consistent_random
    for intent in intents:
        value = json.dumps(intent.to_wire(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        key = f"payment:{intent.entity.id}".encode()
        # Sent twice, as a retrying producer would.
        foreign.produce(topics["intents"], key=key, value=value)
        foreign.produce(topics["intents"], key=key, value=value)
    assert foreign.flush(30) == 0

    deadline = time.monotonic() + 90
    for reply in stream:
        if isinstance(reply, AppliedReply):
            replies.setdefault(reply.intent_key, []).append(reply)
        if all(len(replies.get(i.intent_key, [])) >= 2 for i in intents) or time.monotonic() > deadline:
            break
    stream.close()

    for intent in intents:
        got = replies.get(intent.intent_key, [])
        assert len(got) == 2, f"{intent.entity.id}: {len(got)} applied replies"
        assert sorted(r.duplicate for r in got) == [False, True]
        # Counted where the write happens: one refund, one PATCH.
        assert len(records.read("payment", intent.entity.id)["state"]["refunds"]) == 1
        assert records.patch_requests(intent.intent_key) == 1
    # The owner saw them on the wrong partitions and forwarded them (this is the path under test, not luck):
    # its writ_forwarded_total counter (the log line for each forward is at debug level).
    assert owner_metric(owner, "writ_forwarded_total") >= len(intents)
