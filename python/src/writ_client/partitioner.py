"""Java's default partitioner for keyed records (murmur2), as kafkajs and librdkafka's ``murmur2_random`` compute it.

The client produces with librdkafka's own ``murmur2_random`` partitioner; this
module is for reasoning about partitions without producing (which reply
partition an intent's reply lands on, checks against the golden vectors).
"""

from __future__ import annotations

__all__ = ["murmur2", "partition_for"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit hash of ``data``."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    blocks = length // 4
    for i in range(blocks):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length % 4
    base = length & ~3
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: str | bytes, partitions: int) -> int:
    """``(murmur2(key) & 0x7fffffff) % partitions``; a ``str`` key is hashed as UTF-8."""
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    data = key.encode("utf-8") if isinstance(key, str) else key
    return (murmur2(data) & 0x7FFFFFFF) % partitions
