"""Broker configuration: one dataclass, the same options as the command line."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from mockbroker.namesrv.registration import NAME_RE
from mockbroker.store.retention import RetentionPolicy
from sdk._validation import NAME_RE as GROUP_RE
from sdk._validation import finite_number, host_problem

FlushMode = Literal["async", "sync"]
#: The shortest period of disk checks (retention) the broker takes.
MIN_DISK_CHECK_SECONDS = 0.01


@dataclass(frozen=True)
class BrokerConfig:
    """Everything the broker can be told at start.

    Attributes:
        host: Interface to listen on.
        port: TCP port; 0 (the default for an embedded broker) picks a free one (see
            `address` once started). `python -m mockbroker` listens on 8081 unless told
            otherwise, where the `ordermq` command looks.
        data_dir: Where the commit log, indexes, topics and offsets live.
        flush_mode: "async" flushes at least every `flush_interval_seconds` and answers
            sends before their fsync; "sync" answers a send only after its fsync (group
            commit shares one fsync among concurrent senders).
        lock_lease_seconds: How long a rebalance lock lives without renewal.
        default_queues: Queue count of topics created on first send.
        auto_create_topics: Whether a send or producer route query creates a topic.
        broker_name: The name queues report as their broker.
        segment_bytes: Size at which the commit log rolls to a new segment file. The
            next segment is allocated ahead of the writes while the disk is under
            `disk_high_ratio`: the commit log takes up to two segments more disk than
            its records (that one, and the unwritten rest of the one being written).
        flush_interval_seconds: Period of background flushes and checkpoints.
        sync_flush_timeout_seconds: How long a sync-mode send waits for its fsync before
            answering FLUSH_DISK_TIMEOUT.
        client_timeout_seconds: A client not heard from for this long leaves its groups
            and loses its locks.
        disconnect_grace_seconds: A client whose connection closed (its process died:
            the kernel closes the sockets of a killed process) and that has not
            heartbeated again for this long leaves its groups and loses its locks, so
            the other members take its queues. Keep it above the clients'
            `heartbeat_interval` (a client that merely reconnected heartbeats within
            it) and at least their `lock_lease` (a client cut off from the broker stops
            consuming within its lease, before its queues are given away).
        keepalive_seconds: The broker pings a client connection (gRPC, the v2 front and
            the Exchange port) it has read nothing on for this long, and closes it when
            the ping is not answered within as long: a connection gone silent (a
            client's host gone without a reset, a NAT or a firewall that forgot it) and
            what it held (its streams, push subscriptions) go within twice this, not
            when TCP gives up. gRPC clients answer pings by themselves, even while their
            process is busy; ordermq's clients answer the Exchange port's on their event
            loop.
        metrics_port: Serve Prometheus metrics at http://host:PORT/metrics, and health
            checks at /healthz (liveness) and /readyz (readiness: 503 while starting or
            recovering, or once the store refuses writes) (None: off; 0 picks a free port).
        advertised_host: The host clients are told to connect to in topic routes (None:
            `host`, or 127.0.0.1 when `host` is a wildcard such as 0.0.0.0). Set it when
            clients on other machines use a broker listening on every interface.
        retention_hours: How long commit-log segments are kept after their last write
            (RocketMQ's fileReservedTime); older ones are deleted, with the consume-queue
            and index entries that point into them. Undelivered scheduled messages are
            always kept.
        disk_high_ratio: Above this share of the disk in use, the oldest segments every
            consumer group has read are deleted before their time, one per check
            (RocketMQ's diskMaxUsedSpaceRatio); one holding unread messages is kept.
        disk_force_ratio: Above this share the disk is about to fill: the oldest
            segments are deleted before their time whether read or not, as many at once
            as it takes to get back under this share, each deletion logged with the
            groups it cost.
        disk_refuse_ratio: Above this share, sends are refused with UNAVAILABLE
            (DISK_FULL, retriable) until space is freed; reads, offset commits and locks
            keep working.
        disk_check_seconds: How often disk use is checked and retention applied (at
            least 0.01).
        max_data_bytes: A cap on the broker's own data, the commit log's bytes (None: no
            cap). Above it the oldest segments are deleted at the next check, read or not,
            each deletion logged with the groups it cost; while the log cannot be brought
            under it (the segments over it are still needed: not yet checkpointed, or
            holding an undelivered delayed message), sends are refused with UNAVAILABLE
            (DISK_FULL, retriable). At least two segments (`segment_bytes`).
        disk_usage_file: For tests: read the disk's size and what else uses it from this
            JSON file (`{"total_bytes": N, "other_used_bytes": M}`) instead of the file
            system; the data directory's files count as used on top (None: the real disk).
        fair_scheduling: Serve clients' sends, pulls and receives in turns, so that one
            client flooding the broker does not starve the others (mockbroker/fairness.py):
            checking a send's messages and reading a pull's or a receive's run in slices of
            at most `fair_slice_messages` messages and `fair_slice_bytes` bytes; while several
            clients wait, they get a slice each in turn, and the loop reads sockets and
            answers between slices. A large batch's records are laid out in slices too, then
            written in one piece (all or nothing).
            Off: each request's store work runs whole, in order of arrival.
        fair_slice_messages: Most messages one slice of store work checks or reads
            (at most 1 000 000).
        fair_slice_bytes: Most bytes one slice checks or reads (a slice holds at least
            one message, however large).
        fair_turn_ms: Store work the broker does, while nobody waits, before it lets its
            event loop go round (read sockets, answer, see who else waits).
        busy_poll_us: The standalone broker's event loop (`python -m mockbroker`) polls
            for up to this many microseconds before it sleeps, while requests come that
            densely: a client's next request then does not have to wake it, which costs
            both sides tens of microseconds on a virtual machine (mockbroker/busy_poll.py).
            It stops once a poll finds nothing, so an idle broker sleeps. 0: off; off too
            where the broker may use fewer than 2 cores (its CPU affinity, a container's
            CPU quota). An embedded broker never polls so (it shares its process with the
            application).
        exchange_port: Also serve ordermq's Exchange stream (sends, pulls, push
            subscriptions) over framed TCP on this port, without gRPC's per-request cost
            (0, the default: a free port, kept in the data directory and taken again at
            the next start while it is free; None: off). Routes name it; ordermq's
            clients connect to it beside gRPC and move there once it answers, staying on
            gRPC where it cannot be reached (give it a fixed port to open it through a
            firewall). TLS and `acl_file` as on gRPC (clients sign their connection's
            first frame). The wire: docs/wire-format.md.
        v2_port: Also serve RocketMQ 5's gRPC API (apache.rocketmq.v2.MessagingService, for
            RocketMQ 5's official clients) on this port (None: off; 0 picks a free one, see
            `v2_address` once started). Producers and consumers (receive, ack, change
            invisible duration; FIFO groups as `fifo_groups` says) work on the same store,
            groups and offsets as ordermq's clients.
        client_max_in_flight_bytes: Bytes of one client's requests (sends' messages)
            and answers (pulls' and receives' messages) the broker holds at once; past it,
            the broker reads no more of that client's requests until some are answered (the
            client waits, held back by flow control). One request is always taken, however
            large.
        client_max_locks: Queue locks one client id may hold at once, over every group
            and front; a lock request that would take it past this is refused whole
            (TOO_MANY_LOCKS). It bounds the lock table, and `locks.json`, that one client
            can grow (each entry names at most 255 characters of client id).
        max_topics: Topics the broker holds at most, its own and groups' retry and
            dead-letter topics included; creating one more (a send or route query to a new
            topic, a heartbeat of a new group, an operator's CreateTopic) is refused with
            RESOURCE_EXHAUSTED (TOO_MANY_TOPICS). Each queue of a topic keeps a file open.
        client_max_topics: Topics one client (a connection) may have the broker create,
            by sends and route queries to new topics and by heartbeats naming new groups
            (each gets its retry topic `%RETRY%<group>`); a request that would take it
            past this is refused whole (TOO_MANY_TOPICS), so that one heartbeat naming a
            thousand groups cannot take the broker's file descriptors.
        remoting_port: Serve RocketMQ 4.x remoting (RocketMQ's own clients' broker
            protocol) on this port, on the same store, groups, locks and offsets as gRPC
            (None: off; 0 picks a free port; RocketMQ's default is 10911).
        namesrv_port: Serve a RocketMQ name server on this port, whose routes name this
            broker's remoting port (None: off; 0 picks a free port; RocketMQ's default is
            9876). Needs `remoting_port`.
        namesrv_addr: Standalone name servers to register with, "host:port" separated by
            ";" (RocketMQ's namesrvAddr; None: none). The broker registers its topics with
            each at start, every `register_seconds` and at once when its topics change, and
            unregisters at shutdown; the routes name its remoting port, which it needs.
            Start them with `python -m mockbroker.namesrv`.
        cluster_name: The cluster the broker registers in (RocketMQ's brokerClusterName).
        register_seconds: How often the broker registers with its name servers (RocketMQ:
            30 s, which name servers allow 120 s of silence).
        remoting_max_connections: Connections the remoting port, and the name server,
            each keep open at once; a further one is closed as soon as it is accepted (a
            client that opens sockets without end must not take the descriptors the
            store needs).
        remoting_max_connections_per_host: Of those, how many one remote address may
            have open at once.
        pop_max_in_flight: Per consumer group and queue, the most messages receives
            (pop: ReceiveMessage) may hold between the group's first unsettled message
            and the next one never received: delivered and not yet acknowledged, or held
            back behind them (a FIFO group's message groups). Past it, receives answer
            fewer messages, or none, until acks free room. Bounds the broker's memory
            per group and queue.
        fifo_groups: Consumer groups that receive (pop) FIFO: a message group's next
            message only once the one before is acknowledged or dead-lettered. RocketMQ 5
            clients are told in their settings (RocketMQ keeps it in the subscription
            group's configuration).
        pop_max_delivery_attempts: How often a received message is delivered before,
            its invisible time run out once more without an ack, it goes to the group's
            dead-letter topic `%DLQ%<group>` (RocketMQ's default: the first delivery and
            16 retries). A receive may set its group's own limit.
        transaction_timeout_seconds: A transactional message not committed or rolled
            back this long after it was stored is checked back with a live producer of
            its group (RocketMQ's transactionTimeOut: 6 s).
        transaction_check_seconds: How often a transaction still unknown is checked
            back again (RocketMQ's transactionCheckInterval: 60 s).
        transaction_max_checks: Check-backs of one transaction before it is dropped
            (logged and counted; RocketMQ's transactionCheckMax: 15).
        tls_cert: PEM certificate chain (the broker's certificate first): with `tls_key`,
            every port is served over TLS only (ordermq's gRPC and admin, RocketMQ
            remoting and name server, RocketMQ 5, the metrics page). Checked at start;
            re-read on SIGHUP (`python -m mockbroker`) or `Broker.reload_tls()`.
        tls_key: The certificate's PEM private key, unencrypted.
        tls_client_ca: PEM CA certificate(s): clients must present a certificate signed
            by one of them (mutual TLS). Needs `tls_cert`.
        acl_file: RocketMQ 4.x plain_acl.yml: accounts and their permissions. With it,
            every call of ordermq's gRPC and admin service, of the RocketMQ remoting
            broker port and of the RocketMQ 5 port must be signed by a known account
            (docs/security.md, "Accounts and permissions") and is allowed only
            what the file grants. Checked at start (FILE:LINE of a fault); re-read when
            it changes, `acl_reload_seconds` apart.
        acl_reload_seconds: How often the ACL file is looked at for changes.
        metrics_host: Interface of the metrics and health page (None: loopback, whatever
            `host` is; the page tells anyone who reaches it about topics and groups).
        console_port: Serve the console (pages for people: the broker, topics, groups and
            their lag, offset resets, messages, dead letters and their resend) at
            http://host:PORT/ (None: off; 0 picks a free port). With TLS it is served
            over TLS; with an ACL it asks for an admin account.
        console_host: Interface of the console (None: loopback, whatever `host` is).
        dedup_window_seconds: Broker-side deduplication (docs/dedup.md): a message whose
            idempotency key (its `IDEMPOTENCY_KEY` property, else its message id) was
            stored on the same topic this many seconds ago or less is answered with the
            first one's place and not stored again. 0 (the default): off, as in RocketMQ.
            600 covers every retry of ordermq's and RocketMQ's producers and a restart.
        dedup_max_keys: The most keys the dedup window keeps (at most about 300 bytes each);
            past it the oldest go first, even within the window.
    """

    host: str = "127.0.0.1"
    port: int = 0
    data_dir: Path = Path("./ordermq-data")
    flush_mode: FlushMode = "async"
    lock_lease_seconds: float = 60.0
    default_queues: int = 8
    auto_create_topics: bool = True
    broker_name: str = "broker-a"
    segment_bytes: int = 64 * 1024 * 1024
    flush_interval_seconds: float = 0.5
    sync_flush_timeout_seconds: float = 5.0
    client_timeout_seconds: float = 120.0
    disconnect_grace_seconds: float = 30.0
    keepalive_seconds: float = 60.0
    metrics_port: int | None = None
    advertised_host: str | None = None
    retention_hours: float = 72.0
    disk_high_ratio: float = 0.75
    disk_force_ratio: float = 0.85
    disk_refuse_ratio: float = 0.90
    disk_check_seconds: float = 1.0
    max_data_bytes: int | None = None
    disk_usage_file: Path | None = None
    fair_scheduling: bool = True
    fair_slice_messages: int = 128
    fair_slice_bytes: int = 128 * 1024
    fair_turn_ms: float = 0.5
    client_max_in_flight_bytes: int = 64 * 1024 * 1024
    client_max_locks: int = 4096
    max_topics: int = 4096
    client_max_topics: int = 256
    remoting_port: int | None = None
    namesrv_port: int | None = None
    namesrv_addr: str | None = None
    cluster_name: str = "DefaultCluster"
    register_seconds: float = 30.0
    remoting_max_connections: int = 4096
    remoting_max_connections_per_host: int = 1024
    v2_port: int | None = None
    exchange_port: int | None = 0
    busy_poll_us: int = 400
    pop_max_in_flight: int = 1024
    pop_max_delivery_attempts: int = 17
    transaction_timeout_seconds: float = 6.0
    transaction_check_seconds: float = 60.0
    transaction_max_checks: int = 15
    fifo_groups: tuple[str, ...] = ()
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    acl_file: Path | None = None
    acl_reload_seconds: float = 5.0
    metrics_host: str | None = None
    console_port: int | None = None
    console_host: str | None = None
    dedup_window_seconds: float = 0.0
    dedup_max_keys: int = 1_000_000

    def __post_init__(self) -> None:
        if self.flush_mode not in ("async", "sync"):
            raise ValueError(f"flush_mode must be 'async' or 'sync', not {self.flush_mode!r}")
        for f in fields(self):
            # NaN passes every range check below (each comparison is False), and infinity
            # is no duration, ratio or rate the broker can work with.
            if f.type == "float" and not finite_number(getattr(self, f.name)):
                raise ValueError(f"{f.name} must be a finite number, not {getattr(self, f.name)!r}")
        taken: dict[int, str] = {}
        ports = ("port", "v2_port", "remoting_port", "namesrv_port", "console_port",
                 "exchange_port", "metrics_port")  # fmt: skip
        for name in ports:
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise ValueError(f"{name} {value} is outside 0..65535")
            if value and value in taken:  # None is off, 0 picks a free port
                raise ValueError(f"{taken[value]} and {name} are both {value}: give each its own")
            taken[value] = name
        if self.namesrv_port is not None and self.remoting_port is None:
            raise ValueError(
                "namesrv_port needs remoting_port: the name server's routes point at the "
                "broker's remoting port"
            )
        self.name_servers()  # raises ValueError naming what is wrong
        if not 1 <= self.default_queues <= 1024:
            raise ValueError(f"default_queues {self.default_queues} is outside 1..1024")
        self._require_positive("lock_lease_seconds")
        if self.segment_bytes < 1024 * 1024:
            raise ValueError(f"segment_bytes {self.segment_bytes} must be at least 1048576 (1 MiB)")
        for name in (
            "flush_interval_seconds",
            "sync_flush_timeout_seconds",
            "client_timeout_seconds",
            "disconnect_grace_seconds",
            "keepalive_seconds",
            "fair_slice_messages",
            "fair_slice_bytes",
            "fair_turn_ms",
        ):
            self._require_positive(name)
        # The slice's count reaches C code as a ssize_t: from 2^63 every send failed
        # ("Unexpected OverflowError"); a million is already more than any batch holds.
        if self.fair_slice_messages > 1_000_000:
            raise ValueError(
                f"fair_slice_messages {self.fair_slice_messages} is outside 1..1000000"
            )
        # gRPC takes the keepalive in milliseconds as a C int: past about 24 days its
        # server could not be built (OverflowError at start); a day is already no keepalive.
        if self.keepalive_seconds > 86_400:
            raise ValueError(
                f"keepalive_seconds {self.keepalive_seconds} is outside (0, 86400] (a day)"
            )
        if not 0 <= self.busy_poll_us <= 10_000:
            raise ValueError(f"busy_poll_us must be within 0..10000, not {self.busy_poll_us}")
        for name in (
            "remoting_max_connections",
            "remoting_max_connections_per_host",
            "client_max_in_flight_bytes",
        ):
            self._require_positive(name)
        if not 1 <= self.client_max_locks <= 1_000_000:
            raise ValueError(f"client_max_locks {self.client_max_locks} is outside 1..1000000")
        if not 1 <= self.max_topics <= 1_000_000:
            raise ValueError(f"max_topics {self.max_topics} is outside 1..1000000")
        if not 1 <= self.client_max_topics <= self.max_topics:
            raise ValueError(
                f"client_max_topics {self.client_max_topics} is outside 1..max_topics "
                f"({self.max_topics})"
            )
        if not 1 <= self.pop_max_in_flight <= 1_000_000:
            raise ValueError(f"pop_max_in_flight {self.pop_max_in_flight} is outside 1..1000000")
        if not 0 <= self.dedup_window_seconds <= 7 * 86400:
            raise ValueError(
                f"dedup_window_seconds {self.dedup_window_seconds} is outside 0..604800 (a week)"
            )
        if not 1 <= self.dedup_max_keys <= 100_000_000:
            raise ValueError(f"dedup_max_keys {self.dedup_max_keys} is outside 1..100000000")
        if not 1 <= self.pop_max_delivery_attempts <= 1000:
            raise ValueError(
                f"pop_max_delivery_attempts {self.pop_max_delivery_attempts} is outside 1..1000"
            )
        for name in ("transaction_timeout_seconds", "transaction_check_seconds"):
            if not 0 < getattr(self, name) <= 86_400:
                raise ValueError(f"{name} {getattr(self, name)} is outside (0, 86400]")
        if not 1 <= self.transaction_max_checks <= 1000:
            raise ValueError(
                f"transaction_max_checks {self.transaction_max_checks} is outside 1..1000"
            )
        # The name servers refuse a broker registering under another name (RocketMQ's).
        if not (isinstance(self.broker_name, str) and NAME_RE.fullmatch(self.broker_name)):
            raise ValueError(f"broker_name {self.broker_name!r} must match {NAME_RE.pattern}")
        for group in self.fifo_groups:
            if not (isinstance(group, str) and GROUP_RE.fullmatch(group)):
                raise ValueError(
                    f"fifo_groups names {group!r}, which is no group name (they match "
                    f"{GROUP_RE.pattern})"
                )
        for name in ("host", "advertised_host", "metrics_host", "console_host"):
            value = getattr(self, name)
            problem = None if value is None else host_problem(value)
            if problem is not None:
                raise ValueError(f"{name} {value!r} is no host name or address: {problem}")
        if self.advertised_host is not None and (
            self.advertised_host in ("", "0.0.0.0", "::", "[::]")
            or any(c.isspace() or c == "/" for c in self.advertised_host)
        ):
            raise ValueError(
                f"advertised_host {self.advertised_host!r} must be a host name or address "
                "clients can connect to"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both, or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError(
                "tls_client_ca needs tls_cert and tls_key: client certificates are checked "
                "only on TLS connections"
            )
        # Each check walks the data directory on the event loop: checks much closer
        # together than this left the broker no time to answer anything.
        if not self.disk_check_seconds >= MIN_DISK_CHECK_SECONDS:
            raise ValueError(
                f"disk_check_seconds {self.disk_check_seconds} is below "
                f"{MIN_DISK_CHECK_SECONDS}: disk checks that often leave the broker no time "
                "to serve"
            )
        self._require_positive("acl_reload_seconds")
        self._require_positive("retention_hours")
        if not 0 < self.disk_high_ratio <= self.disk_force_ratio <= self.disk_refuse_ratio <= 1:
            raise ValueError(
                f"disk_high_ratio {self.disk_high_ratio}, disk_force_ratio "
                f"{self.disk_force_ratio} and disk_refuse_ratio {self.disk_refuse_ratio} must "
                "satisfy 0 < high <= force <= refuse <= 1"
            )
        self.retention_policy()  # raises ValueError naming what is wrong
        if self.max_data_bytes is not None and self.max_data_bytes < 2 * self.segment_bytes:
            raise ValueError(
                f"max_data_bytes {self.max_data_bytes} must hold at least two commit-log "
                f"segments ({2 * self.segment_bytes} bytes with segment_bytes "
                f"{self.segment_bytes}): the segment being written is never deleted"
            )
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        for name in ("tls_cert", "tls_key", "tls_client_ca", "acl_file"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))

    def _require_positive(self, name: str) -> None:
        """ValueError naming the field `name` and its value unless it is above 0."""
        value = getattr(self, name)
        if not value > 0:
            raise ValueError(f"{name} must be above 0, not {value}")

    @property
    def tls(self) -> bool:
        """Whether every port is served over TLS."""
        return self.tls_cert is not None

    def name_servers(self) -> list[str]:
        """`namesrv_addr` split into "host:port" addresses (ValueError if malformed)."""
        if self.namesrv_addr is None:
            return []
        addresses = [a.strip() for a in self.namesrv_addr.split(";") if a.strip()]
        if not addresses:
            raise ValueError("namesrv_addr names no name server")
        for address in addresses:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(
                    f"namesrv_addr {address!r} is not host:port (several: separated by ';')"
                )
        if self.remoting_port is None:
            raise ValueError(
                "namesrv_addr needs remoting_port: the name servers route clients to the "
                "broker's remoting port"
            )
        if not NAME_RE.fullmatch(self.cluster_name):
            raise ValueError(f"cluster_name {self.cluster_name!r} must match {NAME_RE.pattern}")
        if not 0 < self.register_seconds <= 60:
            raise ValueError(
                f"register_seconds {self.register_seconds} must be within 0..60 (name servers "
                "drop a broker after 120 s of silence)"
            )
        return addresses

    def retention_policy(self) -> RetentionPolicy:
        """The retention settings as the store takes them."""
        return RetentionPolicy(
            retention_seconds=self.retention_hours * 3600,
            clean_ratio=self.disk_high_ratio,
            force_ratio=self.disk_force_ratio,
            refuse_ratio=self.disk_refuse_ratio,
            max_data_bytes=self.max_data_bytes,
        )
