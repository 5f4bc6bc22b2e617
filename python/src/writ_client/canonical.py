"""Canonical JSON: RFC 8785, the JSON Canonicalization Scheme (JCS).

Byte-identical to writ's TypeScript ``canonicalJson`` (which calls the RFC
author's reference implementation), and to any conforming JCS library. The
rules, and what they take beyond ``json.dumps(sort_keys=True)``:

* no whitespace; arrays keep their order;
* object keys sort by their UTF-16 code units, every key alike (``"10"``
  before ``"9"``, ``""`` first, ``"😀"`` U+1F600 = D83D DE00 before ``"ｚ"``
  U+FF5A), not by code points as Python's ``sorted`` does;
* numbers are IEEE 754 doubles written as ECMAScript ``Number::toString``:
  ``100.0`` is ``100``, ``-0.0`` is ``0``, ``1e21`` is ``1e+21``, ``1.5e-7`` is
  ``1.5e-7``, integers are rounded to doubles (``2**53 + 1`` is
  ``9007199254740992``);
* strings are escaped as ``JSON.stringify`` does: only ``"``, ``\\`` and
  U+0000–U+001F (``\\b \\t \\n \\f \\r``, else ``\\u00xx``); everything else is
  written as is;
* a value with no canonical form raises :class:`CanonicalJsonError` with code
  ``not_canonical``: a string or key with a lone surrogate (a surrogate pair
  written as two code points is the character it encodes), NaN, ±Infinity,
  an ``int`` beyond the double range.

The exact rules are the wire contract in ``python/README.md``; the golden
vectors in ``test/fixtures/intent-key-vectors.json`` pin them.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["CANONICAL_MAX_DEPTH", "CanonicalJsonError", "canonical_json", "js_number", "json_depth", "sha256_hex", "utf16_length", "utf16_sort_key"]

#: Deepest nesting accepted (a scalar is 0, ``[]`` is 1), as in TypeScript.
CANONICAL_MAX_DEPTH = 256

_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f"\\]')
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


class CanonicalJsonError(ValueError):
    """A value that has no canonical JSON.

    ``code`` is ``not_canonical`` (a lone surrogate, NaN, ±Infinity, an int
    beyond the double range), ``input_too_deep`` or ``not_json`` (not a JSON
    value at all).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def sha256_hex(text: str) -> str:
    """Lower-case hex sha256 of ``text`` as UTF-8 (``text`` must be canonical JSON: it has no lone surrogates)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def js_number(value: float | int) -> str:
    """``String(x)`` of the JavaScript number ``value`` denotes (ECMA-262 Number::toString, radix 10): RFC 8785's number form.

    An ``int`` is first rounded to the nearest double, as ``JSON.parse`` does.
    NaN, the infinities and integers past the double range have no canonical
    form: :class:`CanonicalJsonError` (``not_canonical``).
    """
    if isinstance(value, bool):
        raise TypeError("a bool is not a number")
    if isinstance(value, int):
        # int(): an int subclass (an enum with an int mixin) as its value, as json.dumps sends it, never its str().
        value = int(value)
        if -(2**53) <= value <= 2**53:
            return str(value)
        try:
            value = float(value)
        except OverflowError:
            raise CanonicalJsonError("not_canonical", "an integer beyond the double range (it would be Infinity) has no canonical JSON (RFC 8785)") from None
    x = float(value)
    if math.isnan(x) or math.isinf(x):
        raise CanonicalJsonError("not_canonical", f"{x} has no canonical JSON (RFC 8785): NaN and ±Infinity are not JSON numbers")
    if x == 0:
        return "0"  # also -0
    if x < 0:
        return "-" + js_number(-x)
    # repr() is the shortest round-tripping decimal (as JavaScript's); only its layout differs.
    mantissa, _, exponent = repr(x).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    digits = int_part + frac_part
    point = len(int_part) + (int(exponent) if exponent else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    # x = 0.d1d2…dk × 10^n
    k, n = len(digits), point
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    sign = "+" if e >= 0 else "-"
    if k == 1:
        return f"{digits}e{sign}{abs(e)}"
    return f"{digits[0]}.{digits[1:]}e{sign}{abs(e)}"


def _as_js_string(s: str) -> str:
    """The string JavaScript would hold: surrogate pairs written as two code points become one."""
    if _SURROGATE.search(s) is None:
        return s
    return s.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _well_formed(s: str, what: str) -> str:
    """``s`` as JavaScript holds it; :class:`CanonicalJsonError` (``not_canonical``) when a lone surrogate remains."""
    s = _as_js_string(s)
    lone = _SURROGATE.search(s)
    if lone is not None:
        raise CanonicalJsonError(
            "not_canonical",
            f"{what} with a lone surrogate (U+{ord(lone.group()):04X} at index {lone.start()}) has no canonical JSON (RFC 8785)",
        )
    return s


def _quote(s: str, what: str = "a string") -> str:
    s = _well_formed(s, what)
    if _NEEDS_ESCAPE.search(s) is None:
        return '"' + s + '"'
    out = ['"']
    for ch in s:
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch < "\x20":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def utf16_length(s: str) -> int:
    """The length JavaScript gives ``s`` (UTF-16 code units, a character beyond U+FFFF two), as owners check lengths."""
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def utf16_sort_key(key: str) -> bytes:
    """Sorts strings as JavaScript's default ``Array.prototype.sort`` does: by UTF-16 code units."""
    return _as_js_string(key).encode("utf-16-be", "surrogatepass")


def _ordered_keys(obj: Mapping[str, Any]) -> list[str]:
    """The keys in RFC 8785 order: ascending UTF-16 code units, every key alike."""
    keys: list[str] = []
    seen: set[str] = set()
    for key in obj:
        if not isinstance(key, str):
            raise CanonicalJsonError("not_json", f"object keys must be strings, got {type(key).__name__}")
        js_key = _well_formed(key, "an object key")
        if js_key in seen:
            raise CanonicalJsonError("not_json", f"two keys are the same JavaScript string: {js_key!r}")
        seen.add(js_key)
        keys.append(key)
    return sorted(keys, key=utf16_sort_key)


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth (a scalar is 0, ``[]`` is 1), without recursion; ``limit + 1`` once past ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, Mapping):
            children: Any = v.values()
        elif isinstance(v, (list, tuple)):
            children = v
        else:
            continue
        d = depth + 1
        if d > limit:
            return limit + 1
        deepest = max(deepest, d)
        stack.extend((c, d) for c in children if isinstance(c, (Mapping, list, tuple)))
    return deepest


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_quote(value))
    elif isinstance(value, (int, float)):
        out.append(js_number(value))
    elif isinstance(value, Mapping):
        out.append("{")
        first = True
        for key in _ordered_keys(value):
            if not first:
                out.append(",")
            first = False
            out.append(_quote(key, "an object key"))
            out.append(":")
            _write(value[key], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise CanonicalJsonError("not_json", f"{type(value).__name__} is not a JSON value (dict, list, tuple, str, int, float, bool, None)")


def canonical_json(value: Any) -> str:
    """The canonical JSON (RFC 8785, JCS) text of ``value``, as writ's TypeScript ``canonicalJson`` writes it.

    Accepts dicts (any ``Mapping`` with ``str`` keys), lists, tuples, ``str``,
    ``int``, ``float``, ``bool`` and ``None``. Raises :class:`CanonicalJsonError`:
    ``input_too_deep`` for a value nested deeper than
    :data:`CANONICAL_MAX_DEPTH` (before walking it); ``not_canonical`` for a
    string or key with a lone surrogate, NaN, ±Infinity or an ``int`` beyond
    the double range; ``not_json`` for anything else that is not JSON.
    """
    if json_depth(value, CANONICAL_MAX_DEPTH) > CANONICAL_MAX_DEPTH:
        raise CanonicalJsonError("input_too_deep", f"value nested deeper than {CANONICAL_MAX_DEPTH} levels")
    out: list[str] = []
    _write(value, out)
    return "".join(out)
