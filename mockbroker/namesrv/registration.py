"""REGISTER_BROKER and UNREGISTER_BROKER: what a broker tells its name servers, checked.

A broker registers every 30 s with its topics (RocketMQ's `RegisterBrokerBody`: a JSON
document, or when the header says `compressed` a zlib stream of length-prefixed parts) and
unregisters when it shuts down. Everything is checked before anything is used: a request
that does not parse is refused whole (SYSTEM_ERROR naming what is wrong) and changes no
route. The broker's side, `register_request`, writes the JSON form.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import Fields, RemotingCommand, RemotingError

#: RocketMQ's topic name rule (TopicValidator): its brokers' topics, retry and DLQ included.
TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")
#: Broker and cluster names: what RocketMQ's configs allow in practice.
NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,127}$")
#: How long a name server keeps a broker that stopped registering (RocketMQ's 120 s).
DEFAULT_TIMEOUT_SECONDS = 120.0
#: Queue counts a registration may name per topic (RocketMQ has no hard limit; this is
#: far above any real topic and keeps a bad body from making huge routes).
MAX_QUEUES = 65_536
#: PermName: PRIORITY 8, READ 4, WRITE 2, INHERIT 1.
PERM_READ, PERM_WRITE, PERM_MAX = 4, 2, 15
#: A compressed body expands to at most this.
MAX_BODY_BYTES = 64 << 20


@dataclass(frozen=True)
class TopicQueues:
    """One broker's queues of one topic, as its registration states them."""

    read_queues: int
    write_queues: int
    perm: int = PERM_READ | PERM_WRITE
    sys_flag: int = 0


@dataclass(frozen=True)
class Registration:
    """A checked REGISTER_BROKER request."""

    cluster: str
    broker_name: str
    broker_id: int
    address: str
    ha_address: str
    #: (counter, timestamp) of the broker's DataVersion: topics are re-read when it changes.
    data_version: tuple[int, int]
    topics: Mapping[str, TopicQueues]
    #: How long the name server keeps the broker without a new registration.
    timeout_seconds: float


def parse_registration(request: RemotingCommand) -> Registration:
    """The registration `request` carries; RemotingError SYSTEM_ERROR naming what is bad."""
    fields = Fields.of(request)
    cluster = _name(fields, "clusterName")
    broker_name = _name(fields, "brokerName")
    address = _address(fields.string("brokerAddr"), "brokerAddr")
    broker_id = fields.integer("brokerId")
    if broker_id < 0:
        _refuse(f"brokerId {broker_id} is negative")
    ha_address = fields.optional_string("haServerAddr") or ""
    crc = fields.integer("bodyCrc32", 0, bits=32)
    if crc != 0 and zlib.crc32(request.body) & 0x7FFFFFFF != crc:
        _refuse("crc32 not match: the body is not what the broker sent")
    timeout_ms = fields.integer("heartbeatTimeoutMillis", 0)
    if timeout_ms < 0:
        _refuse(f"heartbeatTimeoutMillis {timeout_ms} is negative")
    if fields.boolean("compressed"):
        version, topics = _compressed_body(request.body)
    else:
        version, topics = _json_body(request.body)
    return Registration(
        cluster=cluster,
        broker_name=broker_name,
        broker_id=broker_id,
        address=address,
        ha_address=ha_address,
        data_version=version,
        topics=topics,
        timeout_seconds=timeout_ms / 1000 if timeout_ms else DEFAULT_TIMEOUT_SECONDS,
    )


@dataclass(frozen=True)
class Unregistration:
    """A checked UNREGISTER_BROKER request."""

    cluster: str
    broker_name: str
    broker_id: int
    address: str


def parse_unregistration(request: RemotingCommand) -> Unregistration:
    """The broker `request` unregisters; RemotingError SYSTEM_ERROR naming what is bad."""
    fields = Fields.of(request)
    return Unregistration(
        cluster=_name(fields, "clusterName"),
        broker_name=_name(fields, "brokerName"),
        broker_id=fields.integer("brokerId"),
        address=_address(fields.string("brokerAddr"), "brokerAddr"),
    )


def register_request(
    *,
    cluster: str,
    broker_name: str,
    address: str,
    data_version: tuple[int, int],
    topics: Mapping[str, TopicQueues],
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> RemotingCommand:
    """The REGISTER_BROKER request a master broker sends (JSON body, with its CRC)."""
    table = {
        name: {
            "order": False,
            "perm": q.perm,
            "readQueueNums": q.read_queues,
            "topicFilterType": "SINGLE_TAG",
            "topicName": name,
            "topicSysFlag": q.sys_flag,
            "writeQueueNums": q.write_queues,
        }
        for name, q in sorted(topics.items())
    }
    counter, timestamp = data_version
    body = json.dumps(
        {
            "filterServerList": [],
            "topicConfigSerializeWrapper": {
                "dataVersion": {"counter": counter, "timestamp": timestamp},
                "topicConfigTable": table,
            },
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return RemotingCommand(
        code=RequestCode.REGISTER_BROKER,
        ext_fields={
            "brokerAddr": address,
            "brokerId": "0",
            "brokerName": broker_name,
            "clusterName": cluster,
            "haServerAddr": address,
            "compressed": "false",
            "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF),
            "heartbeatTimeoutMillis": str(int(timeout_seconds * 1000)),
        },
        body=body,
    )


def unregister_request(*, cluster: str, broker_name: str, address: str) -> RemotingCommand:
    """The UNREGISTER_BROKER request a master broker sends as it shuts down."""
    return RemotingCommand(
        code=RequestCode.UNREGISTER_BROKER,
        ext_fields={
            "brokerAddr": address,
            "brokerId": "0",
            "brokerName": broker_name,
            "clusterName": cluster,
        },
    )


# ---------------------------------------------------------------------------- parsing
def _refuse(why: str) -> NoReturn:
    raise RemotingError(ResponseCode.SYSTEM_ERROR, f"REGISTER_BROKER refused: {why}")


def _name(fields: Fields, key: str) -> str:
    value = fields.string(key)
    if not NAME_RE.fullmatch(value):
        _refuse(f"{key} {value[:80]!r} must match {NAME_RE.pattern}")
    return value


def _address(value: str, key: str) -> str:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        _refuse(f"{key} {value[:80]!r} is not host:port")
    return value


def _json_body(body: bytes) -> tuple[tuple[int, int], dict[str, TopicQueues]]:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise RemotingError(
            ResponseCode.SYSTEM_ERROR, f"REGISTER_BROKER refused: the body is not JSON ({exc})"
        ) from None
    wrapper = _object(doc, "body").get("topicConfigSerializeWrapper")
    wrapper = _object(wrapper, "topicConfigSerializeWrapper")
    version = _data_version(wrapper.get("dataVersion"))
    table = _object(wrapper.get("topicConfigTable", {}), "topicConfigTable")
    topics: dict[str, TopicQueues] = {}
    for name, conf in table.items():
        conf = _object(conf, f"topic {name[:80]!r}")
        topics[_topic(name)] = _queues(
            name, conf.get("readQueueNums"), conf.get("writeQueueNums"), conf.get("perm"),
            conf.get("topicSysFlag", 0),
        )  # fmt: skip
    return version, topics


def _compressed_body(body: bytes) -> tuple[tuple[int, int], dict[str, TopicQueues]]:
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(body, MAX_BODY_BYTES)
        if inflater.unconsumed_tail:
            _refuse(f"the compressed body expands past {MAX_BODY_BYTES} bytes")
    except zlib.error as exc:
        raise RemotingError(
            ResponseCode.SYSTEM_ERROR,
            f"REGISTER_BROKER refused: the compressed body does not inflate ({exc})",
        ) from None
    reader = _Reader(raw)
    try:
        version = _data_version(json.loads(reader.part()))
        topics: dict[str, TopicQueues] = {}
        for _ in range(reader.integer()):
            parts = reader.part().decode().split(" ")
            if len(parts) < 4:
                _refuse(f"topic config {' '.join(parts)[:80]!r} has fewer than 4 fields")
            name = _topic(parts[0])
            topics[name] = _queues(name, _int(parts[1]), _int(parts[2]), _int(parts[3]), 0)
    except (ValueError, struct.error, RecursionError) as exc:
        raise RemotingError(
            ResponseCode.SYSTEM_ERROR,
            f"REGISTER_BROKER refused: the compressed body does not parse ({exc})",
        ) from None
    return version, topics


class _Reader:
    """Big-endian ints and int-length-prefixed parts, as Java's ByteBuffer wrote them."""

    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def integer(self) -> int:
        (value,) = struct.unpack_from(">i", self._data, self._at)
        self._at += 4
        if value < 0:
            raise ValueError(f"negative length or count {value}")
        return int(value)

    def part(self) -> bytes:
        size = self.integer()
        if self._at + size > len(self._data):
            raise ValueError(f"a part of {size} bytes runs past the body's end")
        part = self._data[self._at : self._at + size]
        self._at += size
        return part


def _int(text: str) -> int:
    return int(text)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _refuse(f"{what} is not a JSON object")
    return dict(value)


def _data_version(value: Any) -> tuple[int, int]:
    version = _object(value, "dataVersion")
    counter, timestamp = version.get("counter", 0), version.get("timestamp", 0)
    if type(counter) is not int or type(timestamp) is not int:
        _refuse(f"dataVersion {json.dumps(version)[:80]} needs integer counter and timestamp")
    return counter, timestamp


def _topic(name: str) -> str:
    if not TOPIC_RE.fullmatch(name):
        _refuse(f"topic {name[:80]!r} must match {TOPIC_RE.pattern}")
    return name


def _queues(name: str, read: Any, write: Any, perm: Any, sys_flag: Any) -> TopicQueues:
    for key, value, top in (
        ("readQueueNums", read, MAX_QUEUES),
        ("writeQueueNums", write, MAX_QUEUES),
        ("perm", perm, PERM_MAX),
        ("topicSysFlag", sys_flag, 1 << 31),
    ):
        if type(value) is not int or not 0 <= value <= top:
            _refuse(f"topic {name!r}: {key} {value!r} is not an integer within 0..{top}")
    return TopicQueues(read, write, perm, sys_flag)
