"""RocketMQ remoting frames, byte for byte as RocketMQ's Java sources lay them out.

Golden bytes are derived from RemotingCommand / RocketMQSerializable (rocketmq-all-4.9.8)
and the vectors RocketMQ's own RemotingCommandTest and RocketMQSerializableTest use.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mockbroker.fronts.remoting.codec import (
    JSON,
    LANGUAGES,
    ROCKETMQ,
    FrameError,
    decode,
    encode,
    read_command,
)
from mockbroker.fronts.remoting.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand


def header_word(frame: bytes) -> bytes:
    return frame[4:8]


def test_the_header_length_word_carries_the_serialize_type_in_its_top_byte() -> None:
    json_frame = encode(RemotingCommand(105, ext_fields={"topic": "T" * 200}))
    header_length = len(json_frame) - 8
    assert header_word(json_frame) == header_length.to_bytes(4, "big")
    assert header_word(json_frame)[0] == 0x00
    binary = encode(RemotingCommand(105, serialize_type=ROCKETMQ))
    assert header_word(binary) == bytes([0x01, 0, 0, 21])


def test_a_java_route_request_header_is_byte_for_byte_fastjsons() -> None:
    command = RemotingCommand(
        105, opaque=0, flag=0, language="JAVA", version=409, ext_fields={"topic": "TopicTest"}
    )
    frame = encode(command)
    assert frame[8:] == (
        b'{"code":105,"extFields":{"topic":"TopicTest"},"flag":0,"language":"JAVA",'
        b'"opaque":0,"serializeTypeCurrentRPC":"JSON","version":409}'
    )
    assert frame[:8] == bytes.fromhex("00000087 00000083")


def test_the_binary_header_without_remark_or_ext_fields_is_21_bytes() -> None:
    command = RemotingCommand(103, language="JAVA", version=2333, serialize_type=ROCKETMQ)
    header = encode(command)[8:]
    assert header == bytes.fromhex("0067 00 091d 00000000 00000000 00000000 00000000")


def test_the_binary_headers_remark_and_ext_fields_lengths_sit_where_java_reads_them() -> None:
    with_remark = encode(
        RemotingCommand(103, language="JAVA", remark="Sample Remark", serialize_type=ROCKETMQ)
    )[8:]
    assert len(with_remark) == 34 and with_remark[13:17] == (13).to_bytes(4, "big")
    with_ext = encode(
        RemotingCommand(103, language="JAVA", ext_fields={"key": "value"}, serialize_type=ROCKETMQ)
    )[8:]
    assert len(with_ext) == 35 and with_ext[17:21] == (14).to_bytes(4, "big")
    assert with_ext.endswith(bytes.fromhex("0003 6b6579 00000005 76616c7565"))


def test_empty_remark_ext_fields_and_body_decode_as_absent() -> None:
    command = decode(encode(RemotingCommand(103, remark="", ext_fields={}, serialize_type=1))[4:])
    assert (command.remark, command.ext_fields, command.body) == (None, None, b"")


def test_json_ext_fields_that_are_not_strings_read_as_java_prints_them() -> None:
    header = b'{"code":310,"extFields":{"d":4,"k":false,"m":true,"x":null},"opaque":7}'
    frame = len(header).to_bytes(4, "big") + header
    command = decode(frame)
    assert command.ext_fields == {"d": "4", "k": "false", "m": "true"}
    assert (command.code, command.opaque, command.flag) == (310, 7, 0)


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        (b"\x00\x00", "no header-length word"),
        ((50).to_bytes(4, "big") + b"{}", "claims 50 bytes"),
        (b"\x02\x00\x00\x02{}", "unknown serialize type 2"),
        ((7).to_bytes(4, "big") + b"not json", "not JSON"),
        ((2).to_bytes(4, "big") + b"[]", "JSON list, not an object"),
        ((2).to_bytes(4, "big") + b"{}", "'code' is None"),
        ((12).to_bytes(4, "big") + b'{"code":"x"}', "'code' is 'x'"),
        (b"\x01\x00\x00\x05" + bytes(5), "under the minimum of 21"),
        (b"\x01\x00\x00\x15" + bytes(13) + b"\x00\x00\x00\x09" + bytes(4), "remark length 9"),
        (b"\x01\x00\x00\x15" + bytes(13) + b"\xff\xff\xff\xff" + bytes(4), "length -1"),
        (b"\x01\x00\x00\x18" + bytes(17) + b"\x00\x00\x00\x03\x00\x05k", "key length 5"),
    ],
)
def test_malformed_frames_raise_frame_error_naming_the_fault(frame: bytes, words: str) -> None:
    with pytest.raises(FrameError, match=words):
        decode(frame)


def read_from(data: bytes, limit: int = 1 << 24) -> RemotingCommand | None:
    async def main() -> RemotingCommand | None:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_command(reader, limit)

    return asyncio.run(main())


def test_a_stream_yields_commands_and_none_at_a_clean_end() -> None:
    frame = encode(RemotingCommand(34, body=b"{}"))
    assert read_from(frame) == decode(frame[4:])
    assert read_from(b"") is None


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\x00\x00", "inside a frame's length"),
        ((100).to_bytes(4, "big") + b"{", "1 bytes into a frame of 100"),
        ((2**31).to_bytes(4, "big"), "over the limit of 16777216"),
    ],
)
def test_a_cut_or_oversized_frame_on_a_stream_is_refused(data: bytes, words: str) -> None:
    with pytest.raises(FrameError, match=words):
        read_from(data)


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
commands = st.builds(
    RemotingCommand,
    code=st.integers(-(2**15), 2**15 - 1),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.sampled_from([0, FLAG_RESPONSE, FLAG_ONEWAY]),
    language=st.sampled_from(LANGUAGES),
    version=st.integers(-(2**15), 2**15 - 1),
    remark=st.none() | texts.filter(bool),
    ext_fields=st.none() | st.dictionaries(texts.filter(bool), texts.filter(bool), min_size=1),
    body=st.binary(max_size=64),
    serialize_type=st.sampled_from([JSON, ROCKETMQ]),
)


@given(commands)
def test_every_command_survives_a_round_trip_in_either_header_type(
    command: RemotingCommand,
) -> None:
    assert decode(encode(command)[4:]) == command
