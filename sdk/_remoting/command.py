"""RemotingCommand: one request or response of RocketMQ's remoting protocol, decoded.

The frame codec turns bytes into these and back; handlers read a request's `ext_fields`
through `Fields` and answer with `request.response(...)` or by raising `RemotingError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sdk._remoting.codes import ResponseCode

#: `flag` bit 0: the command is a response.
FLAG_RESPONSE = 0x1
#: `flag` bit 1: the request expects no response.
FLAG_ONEWAY = 0x2
#: The version ordermq puts in what it sends (broker and client): RocketMQ 4.9.8's
#: MQVersion ordinal. Java clients record it as the broker's version (401 or more selects
#: standard route JSON).
SERVER_VERSION = 409
#: The language ordermq names in what it sends.
SERVER_LANGUAGE = "PYTHON"


@dataclass(slots=True)
class RemotingCommand:
    """A decoded frame: header fields, ext fields and body.

    `ext_fields` is None when the header carried no extFields object (RocketMQ tells
    "absent" from "empty"); `serialize_type` is 0 for a JSON header, 1 for ROCKETMQ binary.
    """

    code: int
    opaque: int = 0
    flag: int = 0
    language: str = SERVER_LANGUAGE
    version: int = SERVER_VERSION
    remark: str | None = None
    ext_fields: dict[str, str] | None = None
    body: bytes = b""
    serialize_type: int = 0

    @property
    def is_response(self) -> bool:
        """True for a response, False for a request."""
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        """True for a request that expects no response."""
        return bool(self.flag & FLAG_ONEWAY)

    def response(
        self,
        code: int = ResponseCode.SUCCESS,
        *,
        remark: str | None = None,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The response to this request: same opaque and serialize type, response flag set."""
        return RemotingCommand(
            code=int(code),
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=None if ext_fields is None else dict(ext_fields),
            body=body,
            serialize_type=self.serialize_type,
        )


class RemotingError(Exception):
    """A request refused with a RocketMQ response code and remark; nothing was changed."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = int(code)
        self.remark = remark


@dataclass(slots=True)
class Fields:
    """Typed, checked access to a request's extFields (every value is a string on the wire).

    A missing required field or a value that does not parse raises RemotingError
    SYSTEM_ERROR naming the field, as RocketMQ's broker answers such a request.
    """

    values: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, command: RemotingCommand) -> Fields:
        """The ext fields of `command` (empty when it has none)."""
        return cls(command.ext_fields or {})

    def string(self, name: str) -> str:
        """A required string field."""
        value = self.values.get(name)
        if value is None:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"the field {name!r} is missing")
        return value

    def optional_string(self, name: str, default: str | None = None) -> str | None:
        """An optional string field."""
        value = self.values.get(name)
        return default if value is None else value

    def integer(self, name: str, default: int | None = None, *, bits: int = 64) -> int:
        """A required integer field, or `default` when it is absent.

        `bits` is its Java width: 64 for a Long, 32 for an Integer. A value past it is
        refused by name, as Java's parser refuses it.
        """
        value = self.values.get(name)
        if value is None:
            if default is None:
                raise RemotingError(ResponseCode.SYSTEM_ERROR, f"the field {name!r} is missing")
            return default
        try:
            number = int(value.strip())
        except ValueError:
            raise RemotingError(
                ResponseCode.SYSTEM_ERROR, f"the field {name!r} is not an integer: {value!r}"
            ) from None
        if not -(1 << (bits - 1)) <= number < 1 << (bits - 1):
            raise RemotingError(
                ResponseCode.SYSTEM_ERROR,
                f"the field {name!r} is not a {bits}-bit integer: {value[:40]!r}",
            )
        return number

    def boolean(self, name: str, default: bool = False) -> bool:
        """A boolean field, `default` when absent; read as Java's Boolean.parseBoolean.

        "true" in any case is true, anything else false (the C++ client sends "0").
        """
        value = self.values.get(name)
        if value is None:
            return default
        return value.strip().lower() == "true"
