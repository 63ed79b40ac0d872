"""RocketMQ's properties string, read and written as MessageDecoder does (4.9.8)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdk._remoting.properties import (
    decode_properties,
    decode_properties_bytes,
    encode_properties,
    representable,
)

NV, SEP = "\x01", "\x02"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The cases of MessageDecoderTest#testString2messageProperties, restated.
        (f"k1{NV}v1", {"k1": "v1"}),
        ("", {}),
        (" ", {}),
        ("aaa", {}),
        (f"k1{NV}", {}),
        (f"{NV}v1", {}),
        (f"k1{NV}v1{SEP}", {"k1": "v1"}),
        (f"k1{NV}v1{SEP}k2{NV}v2", {"k1": "v1", "k2": "v2"}),
        (f"k1{NV}v1{SEP}{NV}v2", {"k1": "v1"}),
        (f"k1{NV}v1{SEP}k2{NV}", {"k1": "v1"}),
        (f"{NV}v1{SEP}k2{NV}v2", {"k2": "v2"}),
        (f"k1{NV}{SEP}k2{NV}v2", {"k2": "v2"}),
        (f"1{NV}1{SEP}2{NV}2", {"1": "1", "2": "2"}),
        (f"1{NV}{SEP}2{NV}2", {"2": "2"}),
        (f"{NV}1{SEP}2{NV}2", {"2": "2"}),
        (f"1{NV}1{SEP}2{NV}", {"1": "1"}),
        (f"1{NV}1{SEP}{NV}2", {"1": "1"}),
        # Beyond the Java test: the first separator splits, a later duplicate wins, a
        # part without a separator is skipped even when a later part has one, and a
        # trailing separator with nothing after it (what the C++ client sends) is fine.
        (f"k{NV}a{NV}b", {"k": "a\x01b"}),
        (f"k{NV}1{SEP}k{NV}2", {"k": "2"}),
        (f"ab{SEP}k{NV}v", {"k": "v"}),
        (f"{SEP}{SEP}k{NV}v{SEP}{SEP}", {"k": "v"}),
        (f"TAGS{NV}TagA{SEP}WAIT{NV}true{SEP}", {"TAGS": "TagA", "WAIT": "true"}),
    ],
)
def test_decode_skips_what_java_skips(text: str, expected: dict[str, str]) -> None:
    assert decode_properties(text) == expected


def test_encode_has_no_trailing_separator_and_an_empty_map_is_empty() -> None:
    assert encode_properties({}) == ""
    assert encode_properties({"a": "123"}) == "a\x01123"
    assert encode_properties([("TAGS", "TagA"), ("KEYS", "k1 k2")]) == (
        "TAGS\x01TagA\x02KEYS\x01k1 k2"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [("", "v"), ("k", ""), ("k\x01", "v"), ("k\x02", "v"), ("k", "a\x02b")],
)
def test_encode_refuses_an_entry_that_would_not_read_back(name: str, value: str) -> None:
    assert not representable(name, value)
    with pytest.raises(ValueError, match="cannot be carried"):
        encode_properties({"ok": "1", name: value})


def test_a_value_may_hold_the_name_value_separator() -> None:
    assert representable("k", "a\x01b")
    assert decode_properties(encode_properties({"k": "a\x01b"})) == {"k": "a\x01b"}


def test_bytes_that_are_not_utf8_read_as_replacement_characters() -> None:
    assert decode_properties_bytes(b"k\x01\xff\x02n\x01\xc3\xa9") == {"k": "\ufffd", "n": "é"}


@given(
    st.dictionaries(
        st.text(min_size=1).filter(lambda s: "\x01" not in s and "\x02" not in s),
        st.text(min_size=1).filter(lambda s: "\x02" not in s),
    )
)
def test_what_is_representable_round_trips(properties: dict[str, str]) -> None:
    assert decode_properties(encode_properties(properties)) == properties
