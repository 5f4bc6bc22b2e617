"""What each answer of the schema registry to a registration means, against a fake registry (no broker, no registry).

Only 409 and 422 refuse the schema itself (plain JSON, one warning); 401 and 403 refuse writ's login and 404 its
URL (raised at once, not retriable, naming what to put right); 408, 429 and 5xx are an outage (tried again, then
raised retriable). Before, every 4xx but 429 was a refusal: a wrong password wrote plain JSON, told to "check the
subject's compatibility level", and submit then timed out ``unknown``.
"""

from __future__ import annotations

import http.server
import json
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from writ_client import RegistryError, WireCodec

from .test_submit_unit import FakeProducer, intent_input, started_client


class _Registry(http.server.BaseHTTPRequestHandler):
    """Answers every registration ``status``; counts them."""

    status = 200
    registrations: list[str] = []

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length") or 0))
        type(self).registrations.append(self.path)
        status = type(self).status
        body = json.dumps({"id": 7} if status == 200 else {"error_code": status, "message": f"answer {status}"}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def registry() -> Iterator[str]:
    _Registry.registrations = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# 409 and 422 refuse the schema; 403 (a user without the role for this subject) and any other 4xx but 401, 404, 408
# and 429 are refusals too: one subject a registry will not take holds nothing.
@pytest.mark.parametrize("status", [409, 422, 403, 400, 413])
def test_409_422_403_and_other_4xx_refuse_the_schema_plain_json_and_one_warning(registry: str, status: int, caplog: pytest.LogCaptureFixture) -> None:
    _Registry.status = status
    caplog.set_level(logging.WARNING, logger="writ_client")
    codec = WireCodec(registry)
    assert codec.encode("writ.intents", "WriteIntent", {"a": 1}) == b'{"a":1}'
    assert codec.encode("writ.intents", "WriteIntent", {"a": 2}) == b'{"a":2}'
    assert len(_Registry.registrations) == 1
    assert [r.message.count("compatibility level") for r in caplog.records] == [1]


@pytest.mark.parametrize(
    ("status", "names"),
    [
        (401, r"SCHEMA_REGISTRY_USERNAME and SCHEMA_REGISTRY_PASSWORD"),
        (404, r"no /subjects/writ\.intents-value/versions .*SCHEMA_REGISTRY_URL"),
    ],
)
def test_401_and_404_refuse_writs_request_raised_at_once_naming_what_to_put_right(registry: str, status: int, names: str) -> None:
    _Registry.status = status
    with pytest.raises(RegistryError) as err:
        WireCodec(registry).encode("writ.intents", "WriteIntent", {"a": 1})
    assert err.value.status == status and not err.value.retriable
    assert re.search(names, str(err.value)), str(err.value)
    assert len(_Registry.registrations) == 1


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_408_429_and_5xx_are_an_outage_tried_again_then_raised_retriable(registry: str, status: int) -> None:
    _Registry.status = status
    with pytest.raises(RegistryError) as err:
        WireCodec(registry).encode("writ.intents", "WriteIntent", {"a": 1})
    assert err.value.status == status and err.value.retriable
    assert len(_Registry.registrations) == 4


def test_a_submit_with_a_wrong_registry_password_raises_at_once_and_sends_nothing(registry: str) -> None:
    _Registry.status = 401
    producer = FakeProducer()
    client = started_client(producer, schema_registry_url=registry)
    with pytest.raises(RegistryError, match="SCHEMA_REGISTRY_PASSWORD") as err:
        client.submit(intent_input(), timeout=30)
    assert err.value.status == 401 and not err.value.retriable
    assert producer.produced == [] and client._waiting == {}
