"""RocketMQ's two message ids: the broker's offsetMsgId and the client's UNIQ_KEY.

offsetMsgId (MessageDecoder.createMessageId / decodeMessageId) names where a message is
stored: upper-case hex of the store host's IP (4 or 16 bytes), its port (4-byte int) and
the record's commit-log offset (8-byte long): 32 hex digits for an IPv4 host, 56 for IPv6.
A send reply carries it, and a client that wants the message back by id decodes the host
to ask and the offset to ask for (VIEW_MESSAGE_BY_ID).

UNIQ_KEY (MessageClientIDSetter) is the id a producer gives a message before sending it,
in the `UNIQ_KEY` property: upper-case hex of the client's IP (4 or 16 bytes), the low 16
bits of its pid, its class loader's hash (4 bytes), the milliseconds since the start of
the current month in its local time zone (4 bytes) and a 16-bit counter. Other clients
build it otherwise (rocketmq-client-go writes the time and counter in lower case, the C++
client has its own layout): a UNIQ_KEY that arrives is an opaque string; `decode_uniq_key`
reads the Java layout where one wants to look inside.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import secrets
import struct
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

from sdk.clock import Clock

_PORT = struct.Struct(">i")
_OFFSET_TAIL = struct.Struct(">iq")  # port, commit-log offset
_UNIQ_TAIL = struct.Struct(">HiiH")  # pid, class loader hash, time diff, counter
#: A clock stepped back by less than this (NTP) gives a time difference of 0, as in Java.
_CLAMP_NEGATIVE_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class SocketAddress:
    """An IP address (4 or 16 bytes) and a port, as RocketMQ lays out hosts."""

    ip: bytes
    port: int

    def __post_init__(self) -> None:
        if len(self.ip) not in (4, 16):
            raise ValueError(f"an IP address is 4 or 16 bytes, not {len(self.ip)}")
        if not 0 <= self.port <= 0xFFFF_FFFF:
            raise ValueError(f"port {self.port} does not fit in 4 bytes")

    @classmethod
    def parse(cls, text: str) -> SocketAddress:
        """Parse an IP literal and a port: 1.2.3.4:5, [::1]:5 or ::1:5; ValueError otherwise."""
        host, colon, port = text.rpartition(":")
        if not colon or not port.isdigit():
            raise ValueError(f"{text!r} is not host:port")
        ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # what Java reports for a v4 client on a dual-stack socket
        return cls(ip.packed, int(port))

    @property
    def is_v6(self) -> bool:
        """True for a 16-byte (IPv6) address."""
        return len(self.ip) == 16

    def packed(self) -> bytes:
        """The address bytes, then the port as a 4-byte big-endian int (8 or 20 bytes)."""
        return self.ip + self.port.to_bytes(4, "big")

    def __str__(self) -> str:
        ip = ipaddress.ip_address(self.ip)
        return f"[{ip}]:{self.port}" if self.is_v6 else f"{ip}:{self.port}"


#: The address of a message whose born host is unknown (one sent over gRPC).
UNKNOWN_HOST = SocketAddress(bytes(4), 0)


def _from_hex(text: str, what: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not hexadecimal") from None


def create_offset_msg_id(store_host: SocketAddress, commit_log_offset: int) -> str:
    """The offsetMsgId of the record at `commit_log_offset` stored by `store_host`."""
    return (store_host.ip + _OFFSET_TAIL.pack(store_host.port, commit_log_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[SocketAddress, int]:
    """(store host, commit-log offset) of an offsetMsgId; ValueError if it is not one."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"offsetMsgId {msg_id!r} is not 32 or 56 hexadecimal digits")
    raw = _from_hex(msg_id, "offsetMsgId")
    ip_len = 4 if len(raw) == 16 else 16
    port, offset = _OFFSET_TAIL.unpack_from(raw, ip_len)
    return SocketAddress(raw[:ip_len], port & 0xFFFF_FFFF), offset


@dataclass(frozen=True, slots=True)
class UniqKey:
    """The parts of a UNIQ_KEY in MessageClientIDSetter's layout."""

    ip: bytes
    pid: int
    class_loader_hash: int
    time_diff_ms: int
    counter: int

    def __str__(self) -> str:
        return create_uniq_key(
            self.ip, self.pid, self.class_loader_hash, self.time_diff_ms, self.counter
        )


def create_uniq_key(
    ip: bytes, pid: int, class_loader_hash: int, time_diff_ms: int, counter: int
) -> str:
    """A UNIQ_KEY from its parts.

    The pid and the counter keep their low 16 bits, the hash and the time difference
    their low 32 (as Java's casts do).
    """
    if len(ip) not in (4, 16):
        raise ValueError(f"an IP address is 4 or 16 bytes, not {len(ip)}")
    tail = _UNIQ_TAIL.pack(
        pid & 0xFFFF, _int32(class_loader_hash), _int32(time_diff_ms), counter & 0xFFFF
    )
    return (ip + tail).hex().upper()


def decode_uniq_key(key: str) -> UniqKey:
    """The parts of a UNIQ_KEY in the Java layout (any case); ValueError for another layout."""
    if len(key) not in (32, 56):
        raise ValueError(f"UNIQ_KEY {key!r} is not 32 or 56 hexadecimal digits")
    raw = _from_hex(key, "UNIQ_KEY")
    ip_len = len(raw) - _UNIQ_TAIL.size
    pid, loader, diff, counter = _UNIQ_TAIL.unpack_from(raw, ip_len)
    return UniqKey(raw[:ip_len], pid, loader, diff, counter)


def month_start_ms(now_ms: int, tz: tzinfo | None = None) -> int:
    """00:00:00.000 on the 1st of the month of `now_ms`, in `tz` (None: local time)."""
    now = datetime.fromtimestamp(now_ms / 1000, tz)  # naive local time when tz is None
    return _start_of_month(now)


def _next_month_start_ms(month_start: int, tz: tzinfo | None) -> int:
    # Day 1 plus 32 days is always in the next month (wall-clock arithmetic).
    return _start_of_month(datetime.fromtimestamp(month_start / 1000, tz) + timedelta(days=32))


def _start_of_month(moment: datetime) -> int:
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return round(start.timestamp() * 1000)  # a naive time is read as local time


def uniq_key_time_ms(key: str, now_ms: int, tz: tzinfo | None = None) -> int:
    """About when a Java UNIQ_KEY was made (getNearlyTimeFromID).

    This month's start plus the key's time difference, read unsigned (past 24.8 days it
    overflows Java's int); last month's start instead if that lies ahead of `now_ms`.
    """
    diff = decode_uniq_key(key).time_diff_ms & 0xFFFF_FFFF
    start = month_start_ms(now_ms, tz)
    if start + diff >= now_ms:
        start = month_start_ms(start - 1, tz)
    return start + diff


class UniqKeyGenerator:
    """Makes UNIQ_KEYs in MessageClientIDSetter's layout for one process.

    The class loader hash, which Java takes from the JVM, is a random int here; the
    time difference is re-based when a new month starts, on `clock`, in `tz`.
    """

    def __init__(
        self,
        ip: bytes,
        clock: Clock,
        *,
        pid: int | None = None,
        class_loader_hash: int | None = None,
        tz: tzinfo | None = None,
    ) -> None:
        self._ip = ip
        self._clock = clock
        self._pid = os.getpid() if pid is None else pid
        self._loader = (
            int.from_bytes(secrets.token_bytes(4), "big", signed=True)
            if class_loader_hash is None
            else class_loader_hash
        )
        self._tz = tz
        self._counter = itertools.count()
        now = int(clock.now() * 1000)
        self._start = month_start_ms(now, tz)
        self._next_start = _next_month_start_ms(self._start, tz)
        create_uniq_key(ip, 0, 0, 0, 0)  # ValueError now for a bad address

    def next(self) -> str:
        """A new UNIQ_KEY."""
        now = int(self._clock.now() * 1000)
        if now >= self._next_start:
            self._start = month_start_ms(now, self._tz)
            self._next_start = _next_month_start_ms(self._start, self._tz)
        diff = _int32(now - self._start)
        if -_CLAMP_NEGATIVE_MS < diff < 0:
            diff = 0
        return create_uniq_key(self._ip, self._pid, self._loader, diff, next(self._counter))


def _int32(value: int) -> int:
    """`value` cut to a signed 32-bit int, as Java's (int) cast cuts a long."""
    value &= 0xFFFF_FFFF
    return value - (1 << 32) if value & 0x8000_0000 else value


__all__ = [
    "UNKNOWN_HOST",
    "SocketAddress",
    "UniqKey",
    "UniqKeyGenerator",
    "create_offset_msg_id",
    "create_uniq_key",
    "decode_offset_msg_id",
    "decode_uniq_key",
    "month_start_ms",
    "uniq_key_time_ms",
]
