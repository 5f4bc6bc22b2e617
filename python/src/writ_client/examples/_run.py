"""What the examples share: where they run (a running stack, or what they start from a checkout of writ), a
client, a seeded payment, and the last line, measured at the records server: ``{"refunds_created":1}``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from ..client import WritClient
from ..devstack import ChildProcess, RecordsAdmin, ensure_stack, find_repo, start_owner, start_records_server, stop_stack

__all__ = ["Flow", "Say", "count_refunds", "run_example"]

Say = Callable[[str], None]
#: An example's flow: the client, the records server, the seeded payment's id, and where to say what happens.
Flow = Callable[[WritClient, RecordsAdmin, str, Say], Coroutine[Any, Any, dict[str, Any]]]


def count_refunds(records: RecordsAdmin, payment_id: str, say: Say) -> int:
    """The refunds the payment holds at the records server, said and returned: what the example's last line reports."""
    payment = records.read("payment", payment_id)
    refunds = len(payment["state"].get("refunds", []))
    say(f"records server: {payment_id} has {refunds} refund(s) at {payment['version']}")
    return refunds


def run_example(framework: str, slug: str, flow: Flow) -> int:
    """Runs ``flow`` where the environment says (the module docstrings of the examples), prints its lines and, last,
    the refunds counted at the records server; stops what it started. Exit status 1 on a failure, with the tails of
    the logs of what it started."""
    say: Say = lambda line: print(line, flush=True)  # noqa: E731
    run = uuid.uuid4().hex[:8]
    records_url = os.environ.get("RECORDS_URL", "").strip()
    start = os.environ.get("WRIT_EXAMPLE_START") == "1" or not records_url
    children: list[ChildProcess] = []
    started_stack = None
    try:
        if start:
            repo = find_repo()
            stack = ensure_stack(repo)
            if stack.started:
                started_stack = repo
            rec = start_records_server(repo)
            children.append(rec)
            records_url = rec.info["url"]
            topics = {k: f"writ.{k}.ex-py-{slug}-{run}" for k in ("intents", "ledger", "human", "dlq")}
            children.append(start_owner(repo, stack, records_url=records_url, topics=topics, group_id=f"writ.owners.ex-py-{slug}-{run}", intent_partitions=1))
            brokers, registry, intents = stack.brokers, stack.registry_url, topics["intents"]
            say(f"writ + {framework} (run {run}): started a records server and one owner on {intents}")
        else:
            brokers = os.environ.get("KAFKA_BROKERS", "").strip()
            if not brokers:
                raise SystemExit("KAFKA_BROKERS is required with RECORDS_URL (or set WRIT_EXAMPLE_START=1)")
            registry = os.environ.get("SCHEMA_REGISTRY_URL", "").strip()
            intents = os.environ.get("WRIT_INTENTS_TOPIC", "writ.intents")
            say(f"writ + {framework} (run {run}): using the running owner on {intents}")
        say(f"  Kafka {brokers}; registry {registry or 'none (plain JSON)'}; records server {records_url}")
        records = RecordsAdmin(records_url)
        payment_id = f"pay_py_{run}"
        records.seed("payment", payment_id, {"customer": "c-77", "amountCents": 12000, "currency": "EUR", "refunds": []})
        with WritClient(
            brokers=brokers, agent_id="billing-agent", reply_topic=f"writ.replies.billing-agent.py-{run}", intents_topic=intents, schema_registry_url=registry or None
        ) as client:
            result = asyncio.run(flow(client, records, payment_id, say))
    except Exception as err:  # noqa: BLE001 - the example's failure report
        print(f"example failed: {err!r}", file=sys.stderr)
        for child in children:
            print(f"--- {child.name} log (tail) ---\n{child.log_tail()}", file=sys.stderr)
        return 1
    finally:
        for child in reversed(children):
            child.stop()
        if started_stack is not None:
            say("  stopping the local broker and registry this example started")
            stop_stack(started_stack)
    print(json.dumps({"refunds_created": result["refunds_created"]}, separators=(",", ":")))
    return 0
