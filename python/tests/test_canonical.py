"""Canonical JSON and JavaScript number formatting, without a broker."""

from __future__ import annotations

import json

import pytest

from writ_client import KeyedTool, canonical_json, intent_key, js_number
from writ_client.canonical import CANONICAL_MAX_DEPTH, CanonicalJsonError
from writ_client.codec import encode_json
from writ_client.keys import MissingIntentField


@pytest.mark.parametrize(
    ("value", "js"),
    [
        (0.1, "0.1"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (-0.0, "0"),
        (0, "0"),
        (1.5e-7, "1.5e-7"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (100.0, "100"),
        (100, "100"),
        (-12.5e3, "-12500"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (123456789012345680000.0, "123456789012345680000"),
        (2**53, "9007199254740992"),
        (2**53 + 1, "9007199254740992"),
        (12345678901234567890, "12345678901234567000"),
        (10**21, "1e+21"),
        (-(10**21), "-1e+21"),
        (0.30000000000000004, "0.30000000000000004"),
        (1.25e-5, "0.0000125"),
        (1.2345e-7, "1.2345e-7"),
        (123.456, "123.456"),
    ],
)
def test_js_number(value: float, js: str) -> None:
    assert js_number(value) == js


@pytest.mark.parametrize("value", [10**400, -(10**400), 2**1024, float("nan"), float("inf"), float("-inf")], ids=["10**400", "-10**400", "2**1024", "nan", "inf", "-inf"])
def test_numbers_without_a_canonical_form_are_refused(value: float) -> None:
    """RFC 8785 has no form for NaN or ±Infinity (1e400 and integers past the double range parse to Infinity): not null."""
    with pytest.raises(CanonicalJsonError) as err:
        js_number(value)
    assert err.value.code == "not_canonical"
    with pytest.raises(CanonicalJsonError) as err:
        canonical_json({"v": [1, value]})
    assert err.value.code == "not_canonical"
    assert canonical_json(json.loads("1e-400")) == "0"  # underflow is 0, not a refusal


def test_keys_sort_by_utf16_code_units_every_key_alike() -> None:
    """RFC 8785: no array-index keys first (that was JSON.stringify's property order), code units not code points."""
    obj = {"ｚ": 1, "😀": 2, "a": 3, "10": 4, "9": 5, "01": 6, "4294967295": 7, "4294967294": 8, "": 9}
    assert canonical_json(obj) == '{"":9,"01":6,"10":4,"4294967294":8,"4294967295":7,"9":5,"a":3,"😀":2,"ｚ":1}'
    assert canonical_json({"4": 2, "": 1}) == '{"":1,"4":2}'


def test_rfc_8785_published_examples() -> None:
    """Sections 3.2.2 (values) and 3.2.3 (key order) of RFC 8785, outputs as the RFC prints them."""
    values = json.loads(r"""{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","literals":[null,true,false]}""")
    assert canonical_json(values) == r"""{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"""
    keys = json.loads(r"""{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}""")
    assert list(json.loads(canonical_json(keys))) == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


def test_strings_are_escaped_as_json_stringify_does() -> None:
    assert canonical_json('q" b\\ s/ \x00\x01\b\t\n\x0b\f\r\x1f \x7f \u2028 é 漢字 😀') == (
        '"q\\" b\\\\ s/ \\u0000\\u0001\\b\\t\\n\\u000b\\f\\r\\u001f \x7f \u2028 é 漢字 😀"'
    )
    assert canonical_json("\ud83d\ude00") == '"😀"'  # a pair written as two code points is the character


@pytest.mark.parametrize(
    "value",
    ["x\ud800y", "\udc00", "\ude00\ud83d", {"a": [1, {"b": "\ud800"}]}, {"k\udbff": 1}, json.loads('"\\ud800"'), json.loads('{"\\udc00":1}')],
    ids=["high", "low", "reversed-pair", "deep", "key", "parsed", "parsed-key"],
)
def test_lone_surrogates_are_refused(value: object) -> None:
    """RFC 8785 has no form for a lone surrogate, in a string or a key (JSON.stringify wrote \\ud800)."""
    with pytest.raises(CanonicalJsonError) as err:
        canonical_json(value)
    assert err.value.code == "not_canonical"
    assert "lone surrogate" in str(err.value)


def test_nested_values_and_no_whitespace() -> None:
    assert canonical_json({"b": [3, {"z": None, "a": True}], "a": {"y": False, "x": []}}) == '{"a":{"x":[],"y":false},"b":[3,{"a":true,"z":null}]}'


def test_refuses_what_is_not_json() -> None:
    with pytest.raises(CanonicalJsonError):
        canonical_json({1: "a"})
    with pytest.raises(CanonicalJsonError):
        canonical_json({"a": {1, 2}})
    with pytest.raises(CanonicalJsonError):
        canonical_json({"😀": 1, "\ud83d\ude00": 2})  # the same JavaScript string twice


def test_depth_limit_is_the_typescript_one() -> None:
    def nested(n: int) -> object:
        v: object = 1
        for _ in range(n):
            v = [v]
        return v

    canonical_json(nested(CANONICAL_MAX_DEPTH))
    with pytest.raises(CanonicalJsonError) as err:
        canonical_json(nested(CANONICAL_MAX_DEPTH + 1))
    assert err.value.code == "input_too_deep"


def test_intent_key_needs_every_intent_field() -> None:
    tool = KeyedTool(name="refund_payment", key_scope="run", intent_fields=("amountCents", "reason"))
    with pytest.raises(MissingIntentField):
        intent_key(tool=tool, agent_id="a", run_id="r", step_id="s", entity={"type": "payment", "id": "p"}, params={"amountCents": 1})


def test_wire_json_survives_lone_surrogates() -> None:
    assert json.loads(encode_json({"a": "x\ud800", "b": "é"})) == {"a": "x\ud800", "b": "é"}
    with pytest.raises(ValueError):
        encode_json({"a": float("nan")})


def test_int_and_str_subclasses_are_written_as_their_values_as_json_dumps_sends_them() -> None:
    # A params value may be an enum with an int or str mixin (a pydantic model's field, say): the client sends it with
    # json.dumps (its value), so the key and the signature must be computed over that value, not over its str().
    import enum

    class Level(int, enum.Enum):
        LOW = 1

    class Size(enum.IntFlag):
        S = 2

    class Color(str, enum.Enum):
        RED = "red"

    params = {"level": Level.LOW, "size": Size.S, Color.RED: Color.RED}
    assert canonical_json(params) == canonical_json(json.loads(encode_json(params))) == '{"level":1,"red":"red","size":2}'
    assert js_number(Level.LOW) == "1"
    tool = KeyedTool(name="t", key_scope="run", intent_fields=("level",))
    args = {"tool": tool, "agent_id": "a", "run_id": "r", "step_id": "s", "entity": {"type": "t", "id": "x"}}
    assert intent_key(**args, params={"level": Level.LOW}) == intent_key(**args, params={"level": 1})
