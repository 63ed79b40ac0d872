"""RocketMQ's stored-record layout and batch body, against bytes derived from the Java
definitions (MessageDecoder.encode/decode/encodeMessage, MessageSysFlag, String.hashCode).
"""

from __future__ import annotations

import contextlib
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdk._remoting.message_ids import SocketAddress
from sdk._remoting.message_layout import (
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    BatchElement,
    MessageLayoutError,
    MessageRecord,
    UnsupportedCompressionError,
    compress_body,
    compression_type,
    decode_batch,
    decode_records,
    decompress_body,
    encode_batch,
    encode_batch_element,
    encode_record,
    java_string_hash,
    tags_code,
)

# topic abc, body "hello!q!", properties a=123, queue 1, offset 123, commit log 123456,
# born 1600000000000 at 127.0.0.1:0, stored 1600000000001 at 127.0.0.1:10911.
GOLDEN_RECORD = bytes.fromhex(
    "0000006b daa320a7 3cd1c123 00000001 00000000 000000000000007b 000000000001e240"
    " 00000000 00000174876e8000 7f000001 00000000 00000174876e8001 7f000001 00002a9f"
    " 00000000 0000000000000000 00000008 68656c6c6f217121 03 616263 0005 6101313233"
)


def golden() -> MessageRecord:
    return MessageRecord(
        topic="abc",
        body=b"hello!q!",
        properties={"a": "123"},
        queue_id=1,
        queue_offset=123,
        physical_offset=123456,
        born_timestamp_ms=1_600_000_000_000,
        born_host=SocketAddress.parse("127.0.0.1:0"),
        store_timestamp_ms=1_600_000_000_001,
        store_host=SocketAddress.parse("127.0.0.1:10911"),
    )


def test_the_magic_codes_are_javas_signed_ints() -> None:
    assert MESSAGE_MAGIC_CODE - (1 << 32) == -626843481
    assert MESSAGE_MAGIC_CODE_V2 - (1 << 32) == -626843477


def test_a_record_encodes_to_the_golden_bytes() -> None:
    assert len(GOLDEN_RECORD) == 107
    assert encode_record(golden()) == GOLDEN_RECORD


def test_the_golden_record_decodes_field_by_field() -> None:
    [record] = decode_records(GOLDEN_RECORD)
    expected = golden()
    expected.body_crc, expected.store_size = 0x3CD1C123, 107
    assert record == expected
    assert record.offset_msg_id == "7F00000100002A9F000000000001E240"


def test_ipv6_hosts_set_their_sysflag_bits_and_take_16_bytes() -> None:
    record = golden()
    record.born_host = SocketAddress.parse("[::1]:40000")
    record.store_host = SocketAddress.parse("[2001:db8::2]:10911")
    data = encode_record(record)
    assert len(data) == 107 + 12 + 12
    assert int.from_bytes(data[36:40], "big") == 0x10 | 0x20
    [back] = decode_records(data)
    assert (back.born_host, back.store_host) == (record.born_host, record.store_host)
    assert len(back.offset_msg_id) == 56


def test_host_bits_follow_the_hosts_whatever_the_caller_set() -> None:
    record = golden()
    record.sys_flag = 0x10 | 0x20 | 0x2  # v6 bits on v4 hosts would misplace every field
    [back] = decode_records(encode_record(record))
    assert back.sys_flag == 0x2 and back.store_host == record.store_host


def test_a_v2_record_has_a_two_byte_topic_length() -> None:
    data = encode_record(golden(), version=2)
    assert len(data) == 108 and data[4:8] == bytes.fromhex("daa320ab")
    [back] = decode_records(data)
    assert back.topic == "abc" and back.properties == {"a": "123"}
    long_topic = golden()
    long_topic.topic = "t" * 200
    with pytest.raises(ValueError, match="v1 record holds 127"):
        encode_record(long_topic)
    assert decode_records(encode_record(long_topic, version=2))[0].topic == "t" * 200


def test_concatenated_records_decode_in_order() -> None:
    second = golden()
    second.queue_offset, second.body, second.properties = 124, b"two", {}
    data = GOLDEN_RECORD + encode_record(second)
    assert [(r.queue_offset, r.body) for r in decode_records(data)] == [
        (123, b"hello!q!"),
        (124, b"two"),
    ]
    assert decode_records(b"") == []


def test_a_compressed_body_is_inflated_and_its_flags_cleared() -> None:
    plain = b"x" * 5000
    record = golden()
    record.body, record.sys_flag = compress_body(plain), 0x301
    data = encode_record(record)
    assert int.from_bytes(data[8:12], "big") == zlib.crc32(record.body) & 0x7FFFFFFF
    [inflated] = decode_records(data)
    assert (inflated.body, inflated.sys_flag) == (plain, 0)
    [raw] = decode_records(data, decompress=False)
    assert (raw.body, raw.sys_flag) == (record.body, 0x301)


@pytest.mark.parametrize(
    ("sys_flag", "codec"),
    [(0x1, "ZLIB"), (0x101, "LZ4"), (0x201, "ZSTD"), (0x301, "ZLIB")],
)
def test_compression_type_bits(sys_flag: int, codec: str) -> None:
    assert compression_type(sys_flag) == codec


def test_undefined_and_unavailable_codecs_are_refused() -> None:
    with pytest.raises(UnsupportedCompressionError, match="does not define"):
        compression_type(0x401)
    with pytest.raises(UnsupportedCompressionError, match="LZ4"):
        decompress_body(b"\x04\x22\x4d\x18", 0x101, max_bytes=100)


def test_decompression_is_bounded_and_checks_the_stream() -> None:
    bomb = zlib.compress(b"\0" * 10_000_000)
    with pytest.raises(ValueError, match="more than 1000 bytes"):
        decompress_body(bomb, 0x1, max_bytes=1000)
    with pytest.raises(ValueError, match="does not inflate"):
        decompress_body(b"not zlib", 0x1, max_bytes=1000)
    good = zlib.compress(b"hello")
    with pytest.raises(ValueError, match="truncated"):
        decompress_body(good[:-3], 0x1, max_bytes=1000)
    with pytest.raises(ValueError, match="bytes after its end"):
        decompress_body(good + b"junk", 0x1, max_bytes=1000)
    assert decompress_body(good, 0x1, max_bytes=5) == b"hello"


def test_every_truncation_of_a_record_is_refused() -> None:
    for cut in range(1, len(GOLDEN_RECORD)):
        with pytest.raises(MessageLayoutError, match="byte 0"):
            decode_records(GOLDEN_RECORD[:cut])


def test_a_wrong_size_or_magic_is_refused() -> None:
    wrong_size = (108).to_bytes(4, "big") + GOLDEN_RECORD[4:] + b"\0"
    with pytest.raises(MessageLayoutError, match="says it is 108 bytes"):
        decode_records(wrong_size)
    blank = GOLDEN_RECORD[:4] + bytes.fromhex("cbd43194") + GOLDEN_RECORD[8:]
    with pytest.raises(MessageLayoutError, match="magic 0xcbd43194"):
        decode_records(blank)
    negative_topic = GOLDEN_RECORD[:96] + b"\xff" + GOLDEN_RECORD[97:]
    with pytest.raises(MessageLayoutError, match="topic"):
        decode_records(negative_topic)


@given(st.binary(max_size=200))
def test_garbage_raises_layout_errors_only(data: bytes) -> None:
    with contextlib.suppress(MessageLayoutError):
        decode_records(data)


def test_a_batch_element_encodes_to_the_golden_bytes() -> None:
    data = encode_batch_element(b"body", {"key": "value"}, flag=12)
    assert data == bytes.fromhex(
        "00000023 00000000 00000000 0000000c 00000004 626f6479 0009 6b6579 01 76616c7565"
    )
    assert decode_batch(data) == [BatchElement(b"body", {"key": "value"}, 12)]


def test_a_batch_of_a_hundred_round_trips() -> None:
    elements = [
        BatchElement(f"body-{i}".encode(), {"UNIQ_KEY": f"{i:032X}", "TAGS": "T"}, flag=i)
        for i in range(100)
    ]
    assert decode_batch(encode_batch(elements)) == elements


def test_malformed_batch_elements_are_refused() -> None:
    good = encode_batch_element(b"body", {"k": "v"})
    with pytest.raises(MessageLayoutError, match=r"batch element 1: .*truncated"):
        decode_batch(good + good[:-1])
    oversized = (99).to_bytes(4, "big") + good[4:]
    with pytest.raises(MessageLayoutError, match="batch element 0 says it is 99 bytes"):
        decode_batch(oversized)
    huge_body = good[:16] + (2**31 - 1).to_bytes(4, "big") + good[20:]
    with pytest.raises(MessageLayoutError, match="truncated in its body"):
        decode_batch(huge_body)


@pytest.mark.parametrize(
    ("text", "code"),
    [("TagA", 2598919), ("", 0), ("é", 233), ("\U0001f600", 31 * 0xD83D + 0xDE00)],
)
def test_java_string_hash(text: str, code: int) -> None:
    assert java_string_hash(text) == code


def test_java_string_hash_wraps_as_a_signed_int() -> None:
    text = "TagA" * 10
    expected = sum(ord(c) * 31 ** (len(text) - 1 - i) for i, c in enumerate(text)) % 2**32
    expected -= 2**32 if expected >= 2**31 else 0
    assert java_string_hash(text) == expected and expected < 0
    assert tags_code(None) == tags_code("") == 0 and tags_code("TagA") == 2598919
