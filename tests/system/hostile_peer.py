"""A hostile RocketMQ remoting peer for tests/system/test_hostile_peer.py (issue 31).

It speaks the remoting wire to a broker process from an event loop in a thread of the test
process, and does what a well-behaved client never does:

- `stop_reading`: asks for pulls of a 4 MiB message and reads none of the answers, until
  the broker has bytes queued that the peer will not take (seen in /proc/net/tcp);
- `huge_client_id`: HEART_BEAT and LOCK_BATCH_MQ with a client id of 1 MiB, for a group
  nobody joined and for the workers' group;
- `heartbeat_flood`: heartbeats naming many groups nobody else uses;
- `join` then `commit_ahead`: joins the workers' group and pulls with the commit-offset
  bit (sysFlag 0x1) set to each queue's end offset, for queues a worker holds;
- `connection_flood`: opens more connections than the broker takes from one host, from a
  second loopback address, and keeps the ones it took.

Each method runs its coroutine on the peer's loop and waits for it; connections the peer
keeps stay open until `close` (or until the broker dies with them: `forget_connections`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import socket
import struct
import termios
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sdk._remoting.codec import encode
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from tests.remoting_client import RemotingClient

T = TypeVar("T")

#: The RocketMQ pull flags: commit the offset carried in the header; hold the pull.
PULL_COMMIT_OFFSET = 0x1
#: How long one request of the peer may wait for its answer.
ANSWER_TIMEOUT = 10.0


def heartbeat_body(client_id: str, topic: str, *groups: str) -> bytes:
    """A Java push consumer's HEART_BEAT body: `client_id` in `groups`, subscribed to `topic`."""
    return json.dumps({
        "clientID": client_id,
        "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}],
        "consumerDataSet": [
            {"groupName": g, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
             "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
             "subscriptionDataSet": [{"topic": topic, "subString": "*", "tagsSet": [],
                                      "codeSet": [], "subVersion": 1, "expressionType": "TAG",
                                      "classFilterMode": False}]}
            for g in groups
        ],
    }).encode()  # fmt: skip


def lock_body(group: str, client_id: str, topic: str, queues: range) -> bytes:
    """A LOCK_BATCH_MQ body."""
    mq_set = [{"topic": topic, "brokerName": "broker-a", "queueId": q} for q in queues]
    return json.dumps({"consumerGroup": group, "clientId": client_id, "mqSet": mq_set}).encode()


def pull_fields(group: str, topic: str, queue: int, offset: int, **more: str) -> dict[str, str]:
    """A PULL_MESSAGE header from `offset`, not held, no commit unless `more` says so."""
    return {"consumerGroup": group, "topic": topic, "queueId": str(queue),
            "queueOffset": str(offset), "maxMsgNums": "32", "sysFlag": "0",
            "commitOffset": "0", "suspendTimeoutMillis": "0", "subVersion": "0",
            **more}  # fmt: skip


def unsent_bytes(server_port: int, peer_port: int) -> int:
    """Bytes the broker's socket (local `server_port`) has queued for the peer at `peer_port`.

    From /proc/net/tcp's tx_queue: what the kernel holds because the peer's window is full.
    """
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        local, remote, queues = parts[1], parts[2], parts[4]
        if (
            int(local.split(":")[1], 16) == server_port
            and int(remote.split(":")[1], 16) == peer_port
        ):
            return int(queues.split(":")[0], 16)
    return 0


def unread_bytes(sock: socket.socket) -> int:
    """Bytes in `sock`'s receive queue that nobody read (FIONREAD)."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0])


@dataclass
class FloodResult:
    """What a connection flood saw: connections answered, and closed by the broker at once."""

    answered: int
    refused: int


@dataclass
class CommitAttack:
    """Counts of the pulls with a commit bit the peer sent, per queue, while it runs."""

    answered: dict[int, int] = field(default_factory=dict)
    error: BaseException | None = None


class HostilePeer:
    """The peer's event loop in a daemon thread; its methods block until their step is done."""

    def __init__(self, host: str, port: int, topic: str) -> None:
        self.address = f"{host}:{port}"
        self.host, self.port, self.topic = host, port, topic
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hostile-peer")
        self._thread.daemon = True
        self._thread.start()
        self._kept: list[RemotingClient] = []
        self._stuck: list[asyncio.StreamWriter] = []
        self._joined: RemotingClient | None = None
        self._attack: asyncio.Future[None] | None = None
        self._stop_attack = threading.Event()

    def _run(self, work: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout)

    # ------------------------------------------------------------------ (1) stops reading
    def stop_reading(self, group: str, bulk_topic: str, pulls: int = 8) -> int:
        """Pull `bulk_topic` queue 0 `pulls` times, read nothing; the bytes the broker holds."""
        return self._run(self._stop_reading(group, bulk_topic, pulls))

    async def _stop_reading(self, group: str, bulk_topic: str, pulls: int) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await self._loop.sock_connect(sock, (self.host, self.port))
        # A small limit: the stream stops taking bytes off the socket after a few KiB.
        _reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
        self._stuck.append(writer)
        heartbeat = RemotingCommand(
            RequestCode.HEART_BEAT, body=heartbeat_body("stuck@1", bulk_topic, group)
        )
        writer.write(encode(heartbeat))
        for _ in range(pulls):
            fields = pull_fields(group, bulk_topic, 0, 0)
            writer.write(encode(RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=fields)))
        await writer.drain()
        peer_port = sock.getsockname()[1]
        deadline = time.monotonic() + 30
        while (held := unsent_bytes(self.port, peer_port)) == 0 or unread_bytes(sock) == 0:
            assert time.monotonic() < deadline, "the broker never had bytes the peer left unread"
            await asyncio.sleep(0.05)  # polling the kernel's queues with a deadline
        return held

    # ------------------------------------------------------------------ (2) huge client ids
    def huge_client_id(self, groups: list[str], size: int = 1 << 20) -> list[RemotingCommand]:
        """HEART_BEAT, then LOCK_BATCH_MQ of every queue, for each group, as a `size`-char id."""
        return self._run(self._huge_client_id(groups, size))

    async def _huge_client_id(self, groups: list[str], size: int) -> list[RemotingCommand]:
        huge = "h" * size
        client = await RemotingClient.connect(self.address)
        try:
            answers = []
            for group in groups:
                body = heartbeat_body(huge, self.topic, group)
                answers.append(await self._call(client, RequestCode.HEART_BEAT, body))
                body = lock_body(group, huge, self.topic, range(8))
                answers.append(await self._call(client, RequestCode.LOCK_BATCH_MQ, body))
            return answers
        finally:
            await client.close()

    # ------------------------------------------------------------------ (3) many new groups
    def heartbeat_flood(self, prefix: str, groups: int, per_heartbeat: int) -> list[int]:
        """Heartbeats naming `groups` new groups, `per_heartbeat` at a time; their codes."""
        return self._run(self._heartbeat_flood(prefix, groups, per_heartbeat), timeout=120)

    async def _heartbeat_flood(self, prefix: str, groups: int, per_heartbeat: int) -> list[int]:
        client = await RemotingClient.connect(self.address)
        self._kept.append(client)  # its groups stay joined while the connection lives
        codes = []
        names = [f"{prefix}-{i}" for i in range(groups)]
        for i in range(0, groups, per_heartbeat):
            body = heartbeat_body(f"{prefix}@1", self.topic, *names[i : i + per_heartbeat])
            codes.append((await self._call(client, RequestCode.HEART_BEAT, body)).code)
        return codes

    # ------------------------------------------------------------------ (4) commit bits
    def join(self, group: str, client_id: str) -> None:
        """Join `group` by heartbeat on a connection of its own (kept for `commit_ahead`)."""
        self._run(self._join(group, client_id))

    async def _join(self, group: str, client_id: str) -> None:
        self._joined = client = await RemotingClient.connect(self.address)
        answer = await self._call(
            client, RequestCode.HEART_BEAT, heartbeat_body(client_id, self.topic, group)
        )
        assert answer.code == ResponseCode.SUCCESS, answer.remark

    def commit_ahead(self, group: str, client_id: str, queues: list[int]) -> CommitAttack:
        """Start pulling `queues` with the commit bit at their end offset, round after round.

        Runs until `stop_commits` or until the connection fails (the broker was killed);
        the returned counts grow meanwhile.
        """
        attack = CommitAttack({q: 0 for q in queues})
        self._stop_attack.clear()
        self._attack = asyncio.run_coroutine_threadsafe(
            self._commit_ahead(group, client_id, queues, attack), self._loop
        )
        return attack

    async def _commit_ahead(
        self, group: str, client_id: str, queues: list[int], attack: CommitAttack
    ) -> None:
        client = self._joined
        assert client is not None, "join first"
        try:
            while not self._stop_attack.is_set():
                # Still a member: a heartbeat each round, as a client would.
                body = heartbeat_body(client_id, self.topic, group)
                await self._call(client, RequestCode.HEART_BEAT, body)
                for q in queues:
                    end = await client.request(
                        RemotingCommand(
                            RequestCode.GET_MAX_OFFSET,
                            ext_fields={"topic": self.topic, "queueId": str(q)},
                        ),
                        ANSWER_TIMEOUT,
                    )
                    assert end.ext_fields is not None, end.remark
                    ahead = end.ext_fields["offset"]
                    fields = pull_fields(
                        group, self.topic, q, int(ahead), maxMsgNums="1",
                        sysFlag=str(PULL_COMMIT_OFFSET), commitOffset=ahead,
                    )  # fmt: skip
                    command = RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=fields)
                    await client.request(command, ANSWER_TIMEOUT)
                    attack.answered[q] += 1
        except TimeoutError as exc:  # an OSError too: the broker, alive, did not answer
            attack.error = exc
        except (ConnectionError, OSError):
            pass  # the broker went away: the attack ends with it
        except BaseException as exc:
            attack.error = exc
            raise

    def committed(self, group: str, queues: list[int]) -> dict[int, int]:
        """The offsets of `group` the broker answers QUERY_CONSUMER_OFFSET with."""
        return self._run(self._committed(group, queues))

    async def _committed(self, group: str, queues: list[int]) -> dict[int, int]:
        client = await RemotingClient.connect(self.address)
        try:
            found = {}
            for q in queues:
                fields = {"consumerGroup": group, "topic": self.topic, "queueId": str(q)}
                command = RemotingCommand(RequestCode.QUERY_CONSUMER_OFFSET, ext_fields=fields)
                answer = await client.request(command, ANSWER_TIMEOUT)
                assert answer.code == ResponseCode.SUCCESS and answer.ext_fields, answer.remark
                found[q] = int(answer.ext_fields["offset"])
            return found
        finally:
            await client.close()

    def stop_commits(self) -> None:
        """End the commit attack (if still running) and wait for it."""
        self._stop_attack.set()
        if self._attack is not None:
            with contextlib.suppress(Exception):
                self._attack.result(ANSWER_TIMEOUT + 5)

    # ------------------------------------------------------------------ (5) many connections
    def connection_flood(self, count: int, from_host: str) -> FloodResult:
        """Open `count` connections from `from_host` and ask one thing on each; keep them."""
        return self._run(self._connection_flood(count, from_host))

    async def _connection_flood(self, count: int, from_host: str) -> FloodResult:
        host, port = self.host, self.port
        clients = []
        for _ in range(count):
            reader, writer = await asyncio.open_connection(host, port, local_addr=(from_host, 0))
            clients.append(RemotingClient(reader, writer))
        answered = refused = 0
        for client in clients:
            command = RemotingCommand(
                RequestCode.GET_MAX_OFFSET, ext_fields={"topic": self.topic, "queueId": "0"}
            )
            try:
                if client.closed.is_set():  # read its reset already: no answer will come
                    raise ConnectionResetError
                await client.request(command, ANSWER_TIMEOUT)
                answered += 1
                self._kept.append(client)
            except TimeoutError:  # an OSError too: the broker took it and did not answer
                raise
            except (ConnectionError, OSError):
                refused += 1
                await client.close()
        return FloodResult(answered, refused)

    # ------------------------------------------------------------------ the end
    def forget_connections(self) -> None:
        """Drop what the peer kept (the broker that had them was killed)."""
        self._run(self._close_all())

    def close(self) -> None:
        """Close every connection and stop the loop."""
        self.stop_commits()
        self._run(self._close_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _close_all(self) -> None:
        clients = [*self._kept, *([self._joined] if self._joined else [])]
        self._kept, self._joined = [], None
        for client in clients:
            await client.close()
        for writer in self._stuck:
            writer.transport.abort()
        self._stuck = []

    @staticmethod
    async def _call(client: RemotingClient, code: int, body: bytes) -> RemotingCommand:
        return await client.request(RemotingCommand(code, body=body), ANSWER_TIMEOUT)
