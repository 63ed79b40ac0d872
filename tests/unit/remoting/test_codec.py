"""RocketMQ remoting frames, byte for byte as RocketMQ's Java sources lay them out.

Golden bytes are derived from RemotingCommand / RocketMQSerializable (rocketmq-all-4.9.8)
and the vectors RocketMQ's own RemotingCommandTest and RocketMQSerializableTest use.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sdk._remoting.codec import (
    JSON,
    LANGUAGES,
    ROCKETMQ,
    FrameError,
    decode,
    encode,
    read_command,
)
from sdk._remoting.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand
from tests.chaos_report import ChaosRecorder
from tests.fuzzing import fuzz_settings, mutated


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


def json_frame(header: bytes) -> bytes:
    """A frame without its length prefix: the header-length word (JSON), then `header`."""
    return len(header).to_bytes(4, "big") + header


#: Header numbers Python's int() takes or refuses in ways JSON's reader must not pass on.
NOT_INT32_HEADERS = {
    "a code of two minus signs": b'{"code":"--5"}',
    "a code of superscript digits": '{"code":"\u00b2"}'.encode(),
    "a code of 5000 digits": b'{"code":' + b"1" * 5000 + b"}",
    "an opaque of 5000 digits in a string": b'{"code":1,"opaque":"' + b"1" * 5000 + b'"}',
    "an ext field of 5000 digits": b'{"code":1,"extFields":{"n":' + b"1" * 5000 + b"}}",
}


@pytest.mark.parametrize("header", list(NOT_INT32_HEADERS.values()), ids=list(NOT_INT32_HEADERS))
def test_header_numbers_python_cannot_read_raise_frame_error(header: bytes) -> None:
    with pytest.raises(FrameError):
        decode(json_frame(header))


@pytest.mark.parametrize("kind", [JSON, ROCKETMQ])
def test_a_lone_surrogate_is_written_as_javas_utf_8_encoder_writes_it(kind: int) -> None:
    # A JSON request may carry "\ud800" (a topic name echoed in a remark, say): Java's
    # String.getBytes(UTF_8) writes such a character as "?"; the answer must still go out.
    command = RemotingCommand(
        17, remark="topic: a\ud800", ext_fields={"k\udc00": "v\ud800"}, serialize_type=kind
    )
    decoded = decode(encode(command)[4:])
    assert (decoded.remark, decoded.ext_fields) == ("topic: a?", {"k?": "v?"})


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (RemotingCommand(40000), "code 40000"),
        (RemotingCommand(10, version=-40000), "version -40000"),
        (RemotingCommand(10, opaque=2**31), "opaque 2147483648"),
        (RemotingCommand(10, ext_fields={"k" * 40000: "v"}), "key of 40000 bytes"),
    ],
)
def test_what_the_binary_header_cannot_carry_is_refused_naming_it(
    command: RemotingCommand, words: str
) -> None:
    command.serialize_type = ROCKETMQ
    with pytest.raises(ValueError, match=words):
        encode(command)


def test_a_binary_ext_key_length_reads_signed_as_java_reads_it() -> None:
    ext = b"\x80\x00" + b"k" * 8  # key length 0x8000: Java's getShort() reads -32768
    header = bytes(13) + bytes(4) + len(ext).to_bytes(4, "big") + ext
    with pytest.raises(FrameError, match="key length -32768"):
        decode(bytes([ROCKETMQ, 0, 0, len(header)]) + header)


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
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", r"an HTTP/2 \(gRPC\) client's preface"),
        (b"\x16\x03\x01\x02\x00\x01", "a TLS handshake, not a remoting frame"),
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


@fuzz_settings(200, 10_000)
@given(commands)
def test_every_command_survives_a_round_trip_in_either_header_type(
    command: RemotingCommand,
) -> None:
    assert decode(encode(command)[4:]) == command


# ------------------------------------------------------------------------------- fuzzing
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.from_regex(r"-{0,2}[0-9\u00b2]{0,12}", fullmatch=True)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
header_keys = st.sampled_from(
    ["code", "opaque", "flag", "version", "language", "remark", "extFields", "other"]
)
json_headers = st.dictionaries(header_keys, json_values) | st.builds(
    lambda code, ext: {"code": code, "extFields": ext},
    json_values,
    st.dictionaries(st.text(max_size=4), json_values),
)
VALID_FRAMES = [
    encode(RemotingCommand(105, ext_fields={"topic": "orders"}, remark="r", body=b"xyz"))[4:],
    encode(
        RemotingCommand(
            11, ext_fields={"queueId": "3", "topic": "t"}, remark="r", serialize_type=ROCKETMQ
        )
    )[4:],
]


@pytest.mark.chaos
def test_any_bytes_decode_to_a_command_or_raise_frame_error(chaos_report: ChaosRecorder) -> None:
    """What decodes can be answered (encoded again); nothing else escapes but FrameError."""
    seen = 0

    @fuzz_settings(300, 20_000)
    @example(json_frame(b'{"code":"--5"}'))
    @example(json_frame(b'{"code":1,"extFields":{"n":' + b"1" * 5000 + b"}}"))
    @given(
        st.sampled_from(VALID_FRAMES).flatmap(mutated)
        | json_headers.map(lambda h: json_frame(json.dumps(h).encode()))
        | st.binary(max_size=64)
    )
    def run(data: bytes) -> None:
        nonlocal seen
        seen += 1
        try:
            command = decode(data)
        except FrameError:
            return
        assert command.ext_fields is None or all(
            isinstance(v, str) for v in command.ext_fields.values()
        )
        encode(command)

    run()
    chaos_report.record(
        fault="fuzz: remoting frames", rounds=seen, acked=0, lost=0, order_violations=0,
        duplicates=0, note="no crash",
    )  # fmt: skip
