"""Encoding and decoding writ's JSON values: plain JSON, or the Confluent wire format.

With a schema registry (its Confluent-compatible REST API, e.g. Apicurio's
``/apis/ccompat/v7``), a value is framed as magic byte ``0``, the schema id as
a big-endian int32, then the JSON; the schema id is the one registered under
subject ``<topic>-value`` for writ's JSON Schema of the value (one
``POST /subjects/<subject>/versions`` per subject: registering a schema the
subject already has returns its id). Without a registry, plain JSON; when the
registry refuses the schema (409: the subject's compatibility level; 422: a
schema it holds invalid; 403: a user without the role for the subject; any other
4xx but 401, 404, 408 and 429: :func:`is_schema_refusal`), plain JSON too, with one
warning, as TypeScript's codec does. A registry that refuses writ's login (401) or has no such path
(404) raises :class:`RegistryError`, not retriable, naming what to put right. Decoding
accepts both. HTTP(S) with urllib (no dependency beyond the standard library),
with basic auth (:class:`~writ_client.security.RegistryAuth`) and TLS settings
(:class:`~writ_client.security.RegistryTls`) when given; error messages name
the URL and the status, never the credentials.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import struct
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict
from importlib import resources
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

if TYPE_CHECKING:
    import ssl

    from .security import RegistryAuth, RegistryTls

__all__ = ["DecodeError", "RegistryError", "WireCodec", "encode_json", "schema_text"]

MAGIC_BYTE = 0
HEADER_BYTES = 5
#: How deep a decoded value may nest unless the caller says otherwise (TypeScript's ``DEFAULT_MAX_DEPTH``).
DEFAULT_MAX_DEPTH = 64
SchemaName = Literal["WriteIntent", "Reply", "Resolution", "Escalation"]
#: Schema ids a registry confirmed, and ids it did not know (asked again after the TTL): bounded, as
#: TypeScript's codec bounds them, since ids come from records anyone can write.
MAX_KNOWN_SCHEMA_IDS = 4096
MAX_UNKNOWN_SCHEMA_IDS = 1024
UNKNOWN_SCHEMA_ID_TTL = 30.0
#: How long values of a subject whose schema the registry refused go as plain JSON before registering is tried
#: again (TypeScript's ``REFUSED_RETRY_MS``).
REFUSED_RETRY = 60.0
def is_schema_refusal(status: int) -> bool:
    """Whether a registration's 4xx answer leaves the subject's values to go as plain JSON (TypeScript's
    ``isSchemaRefusal``): 409, 422, 403 (writ's user may not register under this subject) and any other 4xx a
    registry gives a schema it will not take; not 401 (the login), 404 (the URL), 408 or 429 (an outage)."""
    return 400 <= status < 500 and status not in (401, 404, 408, 429)


_CREDENTIALS = "schema_registry_auth (SCHEMA_REGISTRY_USERNAME and SCHEMA_REGISTRY_PASSWORD)"

_log = logging.getLogger("writ_client")

K = TypeVar("K")
V = TypeVar("V")


class LruDict(Generic[K, V]):
    """At most ``max_size`` entries; a new key past the bound drops the least recently used one (``src/lru-map.ts``)."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        if key not in self._data:
            return None
        self._data.move_to_end(key)
        return self._data[key]

    def set(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self.max_size:
            self._data.popitem(last=False)

    def delete(self, key: K) -> None:
        self._data.pop(key, None)

    def __len__(self) -> int:
        return len(self._data)


class RegistryError(RuntimeError):
    """The schema registry was unreachable or refused a request (``retriable`` tells which)."""

    def __init__(self, message: str, *, retriable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retriable = retriable
        self.status = status


class DecodeError(ValueError):
    """Bytes that are not a value of the expected schema; ``reason`` as the TypeScript codec names it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def schema_text(name: SchemaName) -> str:
    """The JSON Schema registered for ``name``, as TypeScript's codec sends it (``JSON.stringify`` of ``schemas/<name>.json``).

    The same text from every client keeps one schema version per subject.
    """
    raw = resources.files("writ_client").joinpath("schemas", f"{name}.json").read_text("utf-8")
    return json.dumps(json.loads(raw), ensure_ascii=False, separators=(",", ":"))


def encode_json(value: Any) -> bytes:
    """Compact JSON, UTF-8. NaN and the infinities are refused (they are not JSON)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate cannot be UTF-8: escape every non-ASCII character instead (JSON.parse reads both alike).
        return json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")


# A string, or an unterminated one to the end: every match ends a scan, so the scan is linear in the bytes
# (requiring the closing quote would rescan the rest from every escaped quote).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")


def _nesting(body: bytes) -> int:
    """The deepest bracket nesting of ``body`` outside JSON strings: a valid JSON value's depth, without parsing it.

    A quote or a backslash is never part of a multi-byte UTF-8 sequence, so the scan works on the bytes.
    """
    brackets = _NOT_BRACKET.sub(b"", _JSON_STRING.sub(b"", body))
    if not brackets:
        return 0
    return max(itertools.accumulate(1 if b in b"[{" else -1 for b in brackets))


def json_depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar 0, ``[]`` 1), without recursion; stops at ``limit + 1``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if not isinstance(v, (dict, list)):
            continue
        d = depth + 1
        if d > limit:
            return limit + 1
        deepest = max(deepest, d)
        stack.extend((child, d) for child in (v.values() if isinstance(v, dict) else v) if isinstance(child, (dict, list)))
    return deepest


#: The largest registry answer read (schemas and ids are far smaller); a larger one is an error, not buffered.
_MAX_REGISTRY_ANSWER = 8 * 1024 * 1024


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx stays an answer (an HTTPError with its status), never a second request with the credentials."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None


class WireCodec:
    """Frames values for a topic (with a registry) or writes plain JSON; decodes both."""

    def __init__(
        self,
        schema_registry_url: str | None = None,
        *,
        timeout: float = 10.0,
        frame: bool | None = None,
        auth: RegistryAuth | None = None,
        tls: RegistryTls | None = None,
    ) -> None:
        from .security import check_registry_url

        check_registry_url(schema_registry_url, auth, tls)
        self.registry_url = (schema_registry_url or "").rstrip("/")
        self.timeout = timeout
        if frame and not self.registry_url:
            raise ValueError("framing values needs a schema registry")
        self._auth = auth
        self._ssl_context: ssl.SSLContext | None = tls.ssl_context() if tls is not None else None
        # No redirects: urllib's handler would carry the authorization header to wherever a 3xx points
        # (another host, or http); the TypeScript client's registry library follows none either.
        self._opener = urllib.request.build_opener(_RefuseRedirects, urllib.request.HTTPSHandler(context=self._ssl_context))
        #: Whether encode() frames; default: with a registry. Decoding reads both whenever a registry is known.
        self._frame = self.registry_url != "" if frame is None else frame
        self._ids: dict[str, int] = {}
        #: Subjects whose schema the registry refused, and when it last did.
        self._refused: dict[str, float] = {}
        self._known: LruDict[int, bool] = LruDict(MAX_KNOWN_SCHEMA_IDS)
        #: Unknown ids and when the registry said so.
        self._unknown: LruDict[int, float] = LruDict(MAX_UNKNOWN_SCHEMA_IDS)
        self._lock = threading.Lock()

    @property
    def framed(self) -> bool:
        """True when :meth:`encode` writes the Confluent wire format."""
        return self._frame

    def encode(self, topic: str, name: SchemaName, value: Any, *, subject: str | None = None) -> bytes:
        """``value`` as JSON, framed with the id of ``name``'s schema under ``subject`` (default ``<topic>-value``) when framing.

        A resolution shares the intents topic with intents: it is registered under ``<intents topic>-Resolution``.
        When the registry refuses the schema (:func:`is_schema_refusal`: 409 or 422, the subject's compatibility level
        most often; 403, a user without the role for the subject), the value is
        plain JSON, which owners read like a framed one; a warning says so once, and registering is tried again after
        :data:`REFUSED_RETRY`. Raises :class:`RegistryError` when the registry cannot be reached (``retriable``), or
        refuses writ's request (401: its credentials; 404: its URL; not ``retriable``).
        """
        body = encode_json(value)
        if not self.framed:
            return body
        schema_id = self._framing_id(topic, name, f"{topic}-value" if subject is None else subject)
        return body if schema_id is None else struct.pack(">Bi", MAGIC_BYTE, schema_id) + body

    def decode(self, data: bytes | None, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
        """The JSON value in ``data`` (framed or plain). Raises :class:`DecodeError`; :class:`RegistryError` when the registry cannot be asked.

        A value nested deeper than ``max_depth`` is ``too_deep`` (checked on the bytes before parsing, so no
        hostile nesting reaches the parser's recursion); bytes that are not JSON, or a number past Python's
        integer-digit limit, are ``undecodable``.
        """
        if not data:
            raise DecodeError("undecodable", "empty value")
        body = data
        if data[0] == MAGIC_BYTE:
            if len(data) <= HEADER_BYTES:
                raise DecodeError("undecodable", "truncated wire-format header")
            (schema_id,) = struct.unpack(">i", data[1:HEADER_BYTES])
            # Without a registry (a client of owners that frame what they write) the JSON after the header is the
            # value, validated by its model as any other; with one, the id must be the registry's.
            if self.registry_url and not self.schema_id_exists(schema_id):
                raise DecodeError("undecodable", f"schema id {schema_id} is not in the registry")
            body = data[HEADER_BYTES:]
        if _nesting(body) > max_depth:
            raise DecodeError("too_deep", f"JSON nested deeper than {max_depth} levels")
        try:
            value = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as err:
            # ValueError: JSONDecodeError, or an integer of more digits than int() converts (sys.get_int_max_str_digits()).
            raise DecodeError("undecodable", f"not JSON: {str(err)[:200]}") from err
        # Before anything walks the value (the byte scan above already bounds any valid JSON).
        if json_depth(value, max_depth) > max_depth:
            raise DecodeError("too_deep", f"JSON nested deeper than {max_depth} levels")
        return value

    # -- registry -------------------------------------------------------------------------------

    def schema_id(self, topic: str, name: SchemaName, *, subject: str | None = None) -> int:
        """The id of ``name``'s schema under ``subject`` (default ``<topic>-value``), registered on first use."""
        subject = subject if subject is not None else f"{topic}-value"
        with self._lock:
            cached = self._ids.get(subject)
        if cached is not None:
            return cached
        delay = 0.2
        for attempt in range(4):
            try:
                schema_id = self._register(subject, name)
                break
            except RegistryError as err:
                if not err.retriable or attempt == 3:
                    raise
                time.sleep(delay)
                delay *= 2
        with self._lock:
            self._ids[subject] = schema_id
        return schema_id

    def _framing_id(self, topic: str, name: SchemaName, subject: str) -> int | None:
        """The schema id to frame with, or None while the registry refuses the schema (as TypeScript's codec does: a
        subject an operator left at a level that refuses writ's schema must not stop a resolution or an intent)."""
        with self._lock:
            refused_at = self._refused.get(subject)
        if refused_at is not None and time.monotonic() - refused_at < REFUSED_RETRY:
            return None
        try:
            schema_id = self.schema_id(topic, name, subject=subject)
        except RegistryError as err:
            if err.status is None or not is_schema_refusal(err.status):
                raise
            with self._lock:
                first = subject not in self._refused
                self._refused[subject] = time.monotonic()
            if first:
                _log.warning(
                    "the schema registry refused the schema of %s; its values are written as plain JSON until it accepts it "
                    "(check the subject's compatibility level: docs/operations.md §6.7): %s",
                    subject,
                    err,
                )
            return None
        with self._lock:
            was_refused = self._refused.pop(subject, None) is not None
        if was_refused:
            _log.info("the schema registry accepted the schema of %s again; its values are framed again", subject)
        return schema_id

    def _register(self, subject: str, name: SchemaName) -> int:
        url = f"{self.registry_url}/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        payload = json.dumps({"schemaType": "JSON", "schema": schema_text(name)}, ensure_ascii=False).encode("utf-8")
        status, body = self._http("POST", url, payload)
        if 200 <= status < 300 and isinstance(body, dict) and isinstance(body.get("id"), int):
            return body["id"]
        message = body.get("message", "") if isinstance(body, dict) else ""
        answer = f"{status} {message}".strip()[:500]
        if status in (401, 403):
            who = "login" if status == 401 else "user the registration"
            raise RegistryError(
                f"the schema registry refused writ's {who} of {subject} ({answer}): check {_CREDENTIALS}, and that the user may register schemas",
                retriable=False,
                status=status,
            )
        if status == 404:
            raise RegistryError(
                f"the schema registry has no {urllib.parse.urlsplit(url).path} (404 registering {subject}): schema_registry_url "
                "(SCHEMA_REGISTRY_URL) must be its Confluent-compatible API (Apicurio: .../apis/ccompat/v7)",
                retriable=False,
                status=status,
            )
        # 409 and 422 refuse the schema (a deploy's problem, not a passing fault); 408, 429 and 5xx are an outage.
        raise RegistryError(f"registering {subject} failed: {answer}", retriable=status >= 500 or status in (408, 429), status=status)

    def schema_id_exists(self, schema_id: int) -> bool:
        if not self.registry_url:
            return False
        with self._lock:
            # A known id is known for good (ids are immutable); an unknown one is asked again after a while.
            if self._known.get(schema_id):
                return True
            since = self._unknown.get(schema_id)
            if since is not None and time.monotonic() - since < UNKNOWN_SCHEMA_ID_TTL:
                return False
        status, _ = self._http("GET", f"{self.registry_url}/schemas/ids/{schema_id}", None)
        # Not found; 400 and 422 are answers about the id itself (a registry that refuses a negative one, say),
        # which would otherwise hold the reply partition as an outage. 401, 403 and 5xx stay errors.
        if status in (404, 400, 422):
            known = False
        elif 200 <= status < 300:
            known = True
        else:
            # 401/403: the credentials (schema_registry_auth) are wrong or lack a role; no retry fixes that.
            login = status in (401, 403)
            hint = f": the schema registry refused writ's {'login' if status == 401 else 'user'}; check {_CREDENTIALS}" if login else ""
            raise RegistryError(f"looking up schema id {schema_id} answered {status}{hint}", retriable=not login, status=status)
        with self._lock:
            if known:
                self._known.set(schema_id, True)
                self._unknown.delete(schema_id)
            else:
                self._unknown.set(schema_id, time.monotonic())
        return known

    def _http(self, method: str, url: str, payload: bytes | None) -> tuple[int, Any]:
        headers = {"content-type": "application/vnd.schemaregistry.v1+json", "accept": "application/json"}
        if self._auth is not None:
            headers["authorization"] = self._auth.header()
        req = urllib.request.Request(url, data=payload, method=method, headers=headers)
        try:
            with self._opener.open(req, timeout=self.timeout) as res:
                status, raw = res.status, res.read(_MAX_REGISTRY_ANSWER + 1)
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read(_MAX_REGISTRY_ANSWER + 1)
        except (urllib.error.URLError, OSError) as err:
            raise RegistryError(f"could not reach the schema registry ({method} {url}): {err}", retriable=True) from err
        if len(raw) > _MAX_REGISTRY_ANSWER:
            raise RegistryError(f"the schema registry's answer to {method} {url} is over {_MAX_REGISTRY_ANSWER} bytes", retriable=False, status=status)
        try:
            return status, json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            return status, None
