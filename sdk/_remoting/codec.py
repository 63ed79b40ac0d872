"""RocketMQ remoting frames: RemotingCommand to bytes and back.

A frame is a 4-byte big-endian length L (not counting itself), then a 4-byte word whose
top byte is the serialize type (0 JSON, 1 ROCKETMQ binary) and whose low 24 bits are the
header's length H, then the header, then the body (L - 4 - H bytes). The JSON header is
an object with `code`, `extFields` (strings), `flag`, `language`, `opaque`, `remark`,
`version`; the binary one lays the same fields out in a fixed order (RocketMQSerializable).
Every integer is big-endian; every string UTF-8.

Decoding checks every length against what is there: a frame that does not parse raises
FrameError (and nothing else), and a server closes that connection. Encoding writes text
as Java's UTF-8 encoder does (a lone surrogate, which a JSON peer may send escaped, as "?")
and refuses with ValueError what the binary header's fixed-width fields cannot carry.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
from typing import Any

from sdk._remoting.command import RemotingCommand

#: The longest frame (its length prefix included), as RocketMQ's NettyDecoder allows.
MAX_FRAME_BYTES = 16 * 1024 * 1024
JSON = 0
ROCKETMQ = 1

#: LanguageCode names by their byte in the binary header.
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER",
             "HTTP", "GO", "PHP", "OMS", "RUST", "NODE_JS")  # fmt: skip
_LANGUAGE_CODES = {name: code for code, name in enumerate(LANGUAGES)}

_U32 = struct.Struct(">I")
_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_INT16 = (-(2**15), 2**15 - 1)
_INT32 = (-(2**31), 2**31 - 1)
#: A number in a JSON string, as fastjson would read it for an int field (ASCII digits).
_DECIMAL = re.compile(r"-?[0-9]{1,10}")
#: The binary header's fixed-width fields and the values each can carry.
_BINARY_RANGES = (("code", _INT16), ("version", _INT16), ("opaque", _INT32), ("flag", _INT32))


#: The first 4 bytes an HTTP/2 client sends ("PRI * HTTP/2.0..."): read as a length, 1.3 GB.
_HTTP2_PREFACE_START = b"PRI "
#: A TLS record of type handshake (22), version 3.x: a ClientHello, read as a length, 369 MB.
_TLS_HANDSHAKE_START = b"\x16\x03"


class FrameError(ValueError):
    """Bytes that are not a RemotingCommand frame."""


def encode(command: RemotingCommand) -> bytes:
    """The whole frame of `command`, length prefix included, in its serialize type.

    ValueError for a ROCKETMQ header with a value its fields cannot carry (a code or
    version beyond 16 bits, an opaque or flag beyond 32, an ext key over 32767 bytes).
    """
    if command.serialize_type == ROCKETMQ:
        header = _binary_header(command)
    else:
        header = _json_header(command)
    body = command.body
    return b"".join(
        (
            _U32.pack(4 + len(header) + len(body)),
            _U32.pack((command.serialize_type & 0xFF) << 24 | len(header)),
            header,
            body,
        )
    )


def decode(frame: bytes) -> RemotingCommand:
    """The command in `frame` (without its 4-byte length prefix); FrameError if malformed."""
    if len(frame) < 4:
        raise FrameError(f"a frame of {len(frame)} bytes has no header-length word")
    (word,) = _U32.unpack_from(frame)
    kind, header_length = word >> 24, word & 0xFFFFFF
    if header_length > len(frame) - 4:
        raise FrameError(
            f"the header claims {header_length} bytes; the frame has {len(frame) - 4} after it"
        )
    header = frame[4 : 4 + header_length]
    if kind == JSON:
        command = _from_json(header)
    elif kind == ROCKETMQ:
        command = _from_binary(header)
    else:
        raise FrameError(f"unknown serialize type {kind}")
    command.body = frame[4 + header_length :]
    command.serialize_type = kind
    return command


async def read_command(
    reader: asyncio.StreamReader, max_frame_bytes: int = MAX_FRAME_BYTES
) -> RemotingCommand | None:
    """The next command on `reader`; None at a clean end of stream (between frames).

    FrameError for a frame over `max_frame_bytes`, cut short, or malformed.
    """
    frame = await read_frame(reader, max_frame_bytes)
    return None if frame is None else decode(frame)


async def read_frame(
    reader: asyncio.StreamReader, max_frame_bytes: int = MAX_FRAME_BYTES
) -> bytes | None:
    """The next frame on `reader`, its length prefix left off (as decode() takes it).

    None at a clean end of stream (between frames); FrameError for a frame over
    `max_frame_bytes` (refused before it is read) or cut short.
    """
    try:
        prefix = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("the stream ended inside a frame's length") from exc
    if prefix == _HTTP2_PREFACE_START:
        raise FrameError(
            "an HTTP/2 (gRPC) client's preface, not a remoting frame: an ordermq gRPC client "
            "at a RocketMQ remoting port (it takes rocketmq://, or the broker's gRPC port)"
        )
    if prefix[:2] == _TLS_HANDSHAKE_START:
        raise FrameError("a TLS handshake, not a remoting frame: this port speaks plain text")
    (length,) = _U32.unpack(prefix)
    if length + 4 > max_frame_bytes:
        raise FrameError(f"a frame of {length + 4} bytes is over the limit of {max_frame_bytes}")
    try:
        frame = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(
            f"the stream ended {len(exc.partial)} bytes into a frame of {length}"
        ) from exc
    return frame


# ---------------------------------------------------------------------------------- JSON
def _json_header(command: RemotingCommand) -> bytes:
    header: dict[str, Any] = {
        "code": command.code,
        "flag": command.flag,
        "language": command.language,
        "opaque": command.opaque,
        "serializeTypeCurrentRPC": "JSON",
        "version": command.version,
    }
    if command.ext_fields is not None:
        header["extFields"] = command.ext_fields
    if command.remark is not None:
        header["remark"] = command.remark
    # fastjson's layout: keys sorted, no spaces, non-ASCII as UTF-8, control characters
    # escaped (json escapes them whatever ensure_ascii says).
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _utf8_out(text)


def _from_json(header: bytes) -> RemotingCommand:
    try:
        raw = json.loads(header)
    # ValueError covers JSONDecodeError, UnicodeDecodeError and numbers too long for int().
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"the header is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise FrameError(f"the header is a JSON {type(raw).__name__}, not an object")
    return RemotingCommand(
        code=_json_int(raw, "code", required=True),
        opaque=_json_int(raw, "opaque"),
        flag=_json_int(raw, "flag"),
        language=_json_language(raw.get("language")),
        version=_json_int(raw, "version"),
        remark=_json_text(raw.get("remark"), "remark"),
        ext_fields=_json_ext_fields(raw.get("extFields")),
    )


def _json_int(raw: dict[str, Any], key: str, *, required: bool = False) -> int:
    value = raw.get(key)
    if value is None and not required:
        return 0
    if isinstance(value, str) and _DECIMAL.fullmatch(value):  # lenient, as fastjson
        value = int(value)
    if type(value) is int and _INT32[0] <= value <= _INT32[1]:
        return value
    raise FrameError(f"the header's {key!r} is {value!r}, not a 32-bit integer")


def _json_language(value: Any) -> str:
    if value is None:
        return "OTHER"
    if isinstance(value, str):
        return value
    if type(value) is int and 0 <= value < len(LANGUAGES):
        return LANGUAGES[value]
    raise FrameError(f"the header's 'language' is {value!r}")


def _json_text(value: Any, key: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise FrameError(f"the header's {key!r} is {value!r}, not a string")


def _json_ext_fields(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise FrameError(f"the header's 'extFields' is a JSON {type(value).__name__}")
    fields: dict[str, str] = {}
    for key, item in value.items():
        if item is None:
            continue
        if isinstance(item, bool):  # before int: JSON true is Java's "true"
            fields[key] = "true" if item else "false"
        elif isinstance(item, (str, int, float)):
            fields[key] = str(item)
        else:
            raise FrameError(f"extFields[{key!r}] is a JSON {type(item).__name__}")
    return fields


# -------------------------------------------------------------------------------- binary
def _binary_header(command: RemotingCommand) -> bytes:
    for name, (lo, hi) in _BINARY_RANGES:
        value = getattr(command, name)
        if not lo <= value <= hi:
            raise ValueError(
                f"{name} {value} does not fit the ROCKETMQ header (it takes {lo}..{hi})"
            )
    remark = _utf8_out(command.remark) if command.remark else b""
    ext = b"".join(
        _ext_key(key) + _I32.pack(len(v := _utf8_out(value))) + v
        for key, value in (command.ext_fields or {}).items()
    )
    return b"".join(
        (
            _FIXED.pack(
                command.code,
                _LANGUAGE_CODES.get(command.language, _LANGUAGE_CODES["OTHER"]),
                command.version,
                command.opaque,
                command.flag,
            ),
            _I32.pack(len(remark)),
            remark,
            _I32.pack(len(ext)),
            ext,
        )
    )


def _ext_key(key: str) -> bytes:
    data = _utf8_out(key)
    if len(data) > _INT16[1]:  # its length is a Java short
        raise ValueError(f"an extFields key of {len(data)} bytes does not fit the ROCKETMQ header")
    return _I16.pack(len(data)) + data


def _from_binary(header: bytes) -> RemotingCommand:
    if len(header) < _FIXED.size + 8:
        raise FrameError(f"a binary header of {len(header)} bytes is under the minimum of 21")
    code, language, version, opaque, flag = _FIXED.unpack_from(header)
    pos = _FIXED.size
    remark, pos = _binary_bytes(header, pos, "remark")
    ext, pos = _binary_bytes(header, pos, "extFields")
    if pos != len(header):
        raise FrameError(f"{len(header) - pos} bytes follow the binary header's fields")
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        language=LANGUAGES[language] if language < len(LANGUAGES) else "OTHER",
        version=version,
        remark=_utf8(remark, "remark") if remark else None,
        ext_fields=_binary_ext_fields(ext) if ext else None,
    )


def _binary_bytes(data: bytes, pos: int, what: str) -> tuple[bytes, int]:
    if pos + 4 > len(data):
        raise FrameError(f"the binary header ends before the length of its {what}")
    (length,) = _I32.unpack_from(data, pos)
    pos += 4
    if length < 0 or pos + length > len(data):
        raise FrameError(f"the binary header's {what} length {length} overruns it")
    return data[pos : pos + length], pos + length


def _binary_ext_fields(data: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if pos + 2 > len(data):
            raise FrameError("extFields end inside a key's length")
        (key_length,) = _I16.unpack_from(data, pos)  # signed, as Java's getShort()
        pos += 2
        if key_length < 0 or pos + key_length > len(data):
            raise FrameError(f"an extFields key length {key_length} overruns the map")
        key = data[pos : pos + key_length]
        value, pos = _binary_bytes(data, pos + key_length, "extFields value")
        if key and value:  # RocketMQ reads an empty key or value as null
            fields[_utf8(key, "extFields key")] = _utf8(value, "extFields value")
    return fields


def _utf8_out(text: str) -> bytes:
    # As Java's String.getBytes(UTF_8): a character UTF-8 cannot carry becomes "?".
    return text.encode("utf-8", "replace")


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise FrameError(f"the binary header's {what} is not UTF-8: {exc}") from None
