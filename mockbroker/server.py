"""The broker's lifecycle: open the store, serve gRPC, shut down cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from typing import TYPE_CHECKING

import grpc

from mockbroker.config import BrokerConfig
from mockbroker.dedup import DedupWindow
from mockbroker.dedup_sends import DedupSends, rebuild
from mockbroker.errors import BrokerError
from mockbroker.expiry import release_gone
from mockbroker.fair_store import SlicedStore
from mockbroker.fairness import FairScheduler
from mockbroker.fronts.grpc.admin_service import AdminService
from mockbroker.fronts.grpc.service import MessagingService
from mockbroker.fronts.grpc_errors import add_service
from mockbroker.groups import ConsumerGroups
from mockbroker.identity import broker_id, keep_exchange_port, kept_exchange_port
from mockbroker.limits import ClientLimits
from mockbroker.lock_manager import LOCK_FILE, RebalanceLockManager
from mockbroker.long_polling import PullHolder
from mockbroker.loop_lag import LoopLag
from mockbroker.offset_commits import OffsetCommits
from mockbroker.offsets import ConsumerOffsets
from mockbroker.parking import PARKING_FILE, Parking
from mockbroker.pop import PopService
from mockbroker.retry import RetryService
from mockbroker.schedule import Scheduler
from mockbroker.state import BrokerState
from mockbroker.store.message_store import MessageStore
from mockbroker.store.retention import file_probe
from mockbroker.tls import ServerTLS, TLSFiles
from mockbroker.topic_creation import TopicCreation
from mockbroker.transactions import Transactions
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._version import __version__
from sdk._wire import grpc_server_options
from sdk.clock import Clock, SystemClock, sleep_for
from sdk.tls import TLSConfig

if TYPE_CHECKING:
    # The fronts and features that are off unless configured are imported where they are
    # built: each `python -m mockbroker` (tests start hundreds) pays only for what it serves.
    from mockbroker.acl import Acl
    from mockbroker.fronts.console import ConsoleServer
    from mockbroker.fronts.exchange_port import ExchangePort
    from mockbroker.fronts.grpc.auth import GrpcAuth
    from mockbroker.fronts.remoting.front import RemotingFront
    from mockbroker.fronts.v2.front import V2Front
    from mockbroker.http_status import StatusServer
    from mockbroker.registrar import BrokerRegistrar

log = logging.getLogger("mockbroker")

_WILDCARDS = ("0.0.0.0", "::", "[::]", "")
#: How often silent clients are looked for.
_EXPIRY_SWEEP_SECONDS = 1.0


def _is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (a name is looked up)."""
    name = host.strip("[]")
    if name in _WILDCARDS:
        return False
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def _check_listenable(host: str, port: int) -> None:
    """OSError with the system's reason when no address of `host` can take `port`.

    gRPC tells of a failed bind by writing its own log line to stderr before it raises;
    asking the system first leaves the caller's message alone. Like gRPC (SO_REUSEADDR,
    one bound address is enough), a port left in TIME_WAIT counts as free.
    """
    if port == 0:
        return
    name = host.strip("[]") or None
    try:
        addresses = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    failure: OSError | None = None
    for family, kind, proto, _canonical, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                failure = failure or exc
                continue
        return
    assert failure is not None  # getaddrinfo answers at least one address or raises
    error = OSError(f"cannot listen on {host}:{port}: {failure.strerror}")
    error.errno = failure.errno
    raise error


class Broker:
    """One broker: a message store served over gRPC on the running event loop."""

    def __init__(self, config: BrokerConfig, *, clock: Clock | None = None) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.store = MessageStore(
            config.data_dir,
            sync_flush=config.flush_mode == "sync",
            segment_bytes=config.segment_bytes,
            flush_interval_seconds=config.flush_interval_seconds,
            sync_flush_timeout_seconds=config.sync_flush_timeout_seconds,
            clock=self.clock,
            retention=config.retention_policy(),
            disk_probe=(
                file_probe(config.disk_usage_file, config.data_dir)
                if config.disk_usage_file is not None
                else None
            ),
            retention_check_seconds=config.disk_check_seconds,
        )
        self.offsets = ConsumerOffsets(config.data_dir / "offsets.json")
        self.state: BrokerState | None = None
        self._server: grpc.aio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        #: How late the event loop runs what is due (ordermq_event_loop_lag_seconds).
        self.loop_lag = LoopLag()
        self._lag_probe: asyncio.Task[None] | None = None
        self._http: StatusServer | None = None
        self._console: ConsoleServer | None = None
        self._messaging: MessagingService | None = None
        #: RocketMQ remoting and its name server (None while not serving).
        self.remoting: RemotingFront | None = None
        #: Registers with standalone name servers (config.namesrv_addr; None: none).
        self.registrar: BrokerRegistrar | None = None
        self._v2: V2Front | None = None
        #: ordermq's Exchange over framed TCP (config.exchange_port; None while off).
        self.exchange_port: ExchangePort | None = None
        self._stopping = False
        self.port = 0
        #: The TLS every port is served with (None: plain text).
        self.tls: ServerTLS | None = None
        #: The accounts and permissions of config.acl_file (None: no ACL, everyone served).
        self.acl: Acl | None = None
        self._acl_watcher: asyncio.Task[None] | None = None

    @property
    def metrics_port(self) -> int | None:
        """The port /metrics, /healthz and /readyz are served on, when enabled."""
        return self._http.port if self._http is not None else None

    @property
    def console_address(self) -> str | None:
        """'host:port' the console is served on, when enabled."""
        if self._console is None:
            return None
        return f"{self._interface(self.config.console_host)}:{self._console.port}"

    @property
    def metrics_address(self) -> str | None:
        """'host:port' /metrics, /healthz and /readyz are served on, when enabled."""
        return f"{self._metrics_host()}:{self._http.port}" if self._http is not None else None

    @property
    def stopping(self) -> bool:
        """True once stop() began (the store closes on its way)."""
        return self._stopping

    def readiness(self) -> str | None:
        """Why the broker is not ready to serve now; None once it is.

        Ready means recovered, serving, and with a store that accepts writes (a failed
        write or fsync makes it refuse them for good).
        """
        if self._stopping:
            return "the broker is stopping"
        if self.state is None:
            if self.store.recovering:
                return "recovering the store after an unclean shutdown"
            return "starting"
        return self.store.write_refusal()

    @property
    def exchange_streams(self) -> int:
        """How many clients' Exchange streams (their Send and Pull) are being served."""
        return self._messaging.exchanges.open_streams if self._messaging is not None else 0

    @property
    def address(self) -> str:
        """'host:port' clients connect to: advertised_host, else host (loopback for 0.0.0.0)."""
        return f"{self._client_host()}:{self.port}"

    @property
    def v2_address(self) -> str | None:
        """'host:port' of the RocketMQ 5 (apache.rocketmq.v2) front, when it is on."""
        return f"{self._client_host()}:{self._v2.port}" if self._v2 is not None else None

    @property
    def exchange_address(self) -> str | None:
        """'host:port' of the Exchange port (framed TCP), when it is on."""
        port = self.exchange_port
        return f"{self._client_host()}:{port.port}" if port is not None else None

    def _client_host(self) -> str:
        host = self.config.advertised_host
        if host is None:
            host = "127.0.0.1" if self.config.host in _WILDCARDS else self.config.host
        return host

    async def start(self) -> None:
        """Open (and if need be recover) the store, then start serving.

        The HTTP endpoint (metrics and health checks), when enabled, serves from the
        start: not ready until the store is recovered and requests are served.
        """
        config = self.config
        if config.tls_cert is not None and config.tls_key is not None:
            files = TLSFiles(config.tls_cert, config.tls_key, config.tls_client_ca)
            self.tls = await asyncio.to_thread(ServerTLS, files)  # TLSCertificateError
        if config.acl_file is not None:
            from mockbroker.acl import Acl, load_acl_file

            # AclFileError (FILE:LINE: what is wrong) or OSError: the broker does not start.
            self.acl = Acl(await asyncio.to_thread(load_acl_file, config.acl_file))
        await asyncio.to_thread(_check_listenable, config.host, config.port)
        for port in (config.v2_port, config.remoting_port, config.namesrv_port,
                     config.exchange_port):  # fmt: skip
            if port is not None:  # refused here, before anything has started serving
                await asyncio.to_thread(_check_listenable, config.host, port)
        if config.metrics_port is not None:
            # Here, not at the top: prometheus_client and wsgiref cost every broker
            # process a tenth of a second of CPU at start, and most serve no metrics.
            from mockbroker.http_status import StatusServer

            host = self._metrics_host()
            self._http = StatusServer(
                self, host, config.metrics_port, self.tls.ssl_context() if self.tls else None
            )
            log.info("metrics and health checks on %s://%s/",
                     "https" if self.tls else "http", self.metrics_address)  # fmt: skip
        try:
            await asyncio.to_thread(self.store.open)  # OSError if the directory is in use
            try:
                await self._start_serving()
            except BaseException:
                await self.store.close()
                raise
        except BaseException:
            await self._close_http()
            raise

    async def _start_serving(self) -> None:
        self.offsets.load()
        # Before the store starts, so that no retention check runs without the offsets.
        self.store.on_trim = self.offsets.note_trimmed
        self.store.committed_offsets = self.offsets.saved
        locks = RebalanceLockManager(
            self.clock, self.config.lock_lease_seconds, self.config.data_dir / LOCK_FILE
        )
        await asyncio.to_thread(locks.load, previous_run=bool(self.offsets.groups()))
        await self.store.start()
        # Before anything else writes to the queues: it finishes releases a crash cut off.
        creation = TopicCreation(
            self.store,
            max_topics=self.config.max_topics,
            client_max_topics=self.config.client_max_topics,
        )
        parking = Parking(
            self.store,
            self.clock,
            creation.system_topic,
            locks.check_commit,
            self.offsets.get,
            self.config.data_dir / PARKING_FILE,
        )
        await asyncio.to_thread(parking.load)
        await parking.recover()
        scheduler = Scheduler(self.store, self.clock)
        scheduler.load()
        transactions = Transactions(
            self.store,
            self.clock,
            timeout_seconds=self.config.transaction_timeout_seconds,
            check_seconds=self.config.transaction_check_seconds,
            max_checks=self.config.transaction_max_checks,
        )
        transactions.load()
        await transactions.recover()
        holder = PullHolder(self.clock)
        self.store.on_append = holder.notify
        retry = RetryService(self.store, scheduler, self.clock, creation)
        pop = PopService(
            self.config.data_dir / "pop",
            store=self.store,
            offsets=self.offsets,
            retry=retry,
            holder=holder,
            clock=self.clock,
            max_in_flight=self.config.pop_max_in_flight,
            max_attempts=self.config.pop_max_delivery_attempts,
            commit_interval_seconds=self.config.flush_interval_seconds,
        )
        pop.load()
        try:
            await self._serve(locks, scheduler, transactions, holder, retry, pop, parking)
        except BaseException:
            await pop.journal.close()
            raise

    async def _dedup_sends(self) -> DedupSends | None:
        """The dedup window, refilled from the store's last window of records; None if off."""
        if not self.config.dedup_window_seconds:
            return None
        config = self.config
        window = DedupWindow(config.dedup_window_seconds, config.dedup_max_keys, self.clock)
        now_ms = int(self.clock.now() * 1000)
        kept = await asyncio.to_thread(rebuild, window, self.store, now_ms)
        log.info("dedup window: %d keys of the last %g s refilled from the store",
                 kept, self.config.dedup_window_seconds)  # fmt: skip
        return DedupSends(window, self.store)

    async def _serve(
        self,
        locks: RebalanceLockManager,
        scheduler: Scheduler,
        transactions: Transactions,
        holder: PullHolder,
        retry: RetryService,
        pop: PopService,
        parking: Parking,
    ) -> None:
        state = BrokerState(
            config=self.config,
            clock=self.clock,
            store=self.store,
            offsets=self.offsets,
            locks=locks,
            groups=ConsumerGroups(
                self.clock,
                self.config.client_timeout_seconds,
                self.config.disconnect_grace_seconds,
            ),
            holder=holder,
            scheduler=scheduler,
            retry=retry,
            started=self.clock.now(),
            sliced=self._sliced_store(),
            limits=ClientLimits(self.config.client_max_in_flight_bytes),
            pop=pop,
            commits=OffsetCommits(self.store, self.offsets, locks),
            topic_creation=retry.topics,
            transactions=transactions,
            dedup=await self._dedup_sends(),
            parking=parking,
        )
        pop.sliced, pop.limits = state.sliced, state.limits  # receives share like pulls
        options = grpc_server_options(self.config.keepalive_seconds)
        server = grpc.aio.server(options=options)
        auth: GrpcAuth | None = None
        if self.acl is not None:
            from mockbroker.fronts.grpc.auth import GrpcAuth

            auth = GrpcAuth(self.acl, self.clock, topic_of_scheduled=scheduler.topic_of)
        self._messaging = MessagingService(state, auth)
        services = pb.DESCRIPTOR.services_by_name
        add_service(server, services["MessagingService"], self._messaging, auth)
        admin = AdminService(state)
        add_service(server, services["AdminService"], admin, auth)
        listen = f"{self.config.host}:{self.config.port}"
        try:
            self.port = (
                server.add_secure_port(listen, self.tls.grpc_credentials())
                if self.tls is not None
                else server.add_insecure_port(listen)
            )
        except RuntimeError as exc:  # taken since the check
            raise OSError(f"cannot listen on {self.config.host}:{self.config.port}: {exc}") from exc
        state.address = self.address
        if self.config.v2_port is not None:
            from mockbroker.fronts.v2.auth import V2Auth  # its generated protos: only if on
            from mockbroker.fronts.v2.front import V2Front
            from mockbroker.fronts.v2.pop_adapter import PopCoreAdapter

            fifo = frozenset(self.config.fifo_groups)
            v2_auth = V2Auth(self.acl, self.clock) if self.acl is not None else None
            v2 = V2Front(state, PopCoreAdapter(pop, self.clock, fifo), v2_auth)
            try:
                await v2.start(
                    self.config.host, self.config.v2_port, self._client_host(),
                    self.tls.grpc_credentials() if self.tls is not None else None, options,
                )  # fmt: skip
            except BaseException:
                await server.stop(None)
                raise
            self._v2 = v2
            log.info("RocketMQ 5 (apache.rocketmq.v2) clients served on %s", self.v2_address)
        if self.config.exchange_port is not None:
            from mockbroker.fronts.exchange_port import ExchangePort  # only where it is on

            state.exchange_broker_id = broker_id(self.config.data_dir)
            exchange_port = ExchangePort(
                self._messaging.exchanges,
                broker_id=state.exchange_broker_id,
                keepalive_seconds=self.config.keepalive_seconds,
                clock=self.clock,
                auth=auth,
                refused=self._messaging.requests.refused,
            )
            tls = self.tls.ssl_context() if self.tls is not None else None
            chosen = self.config.exchange_port  # 0: the last start's, while it is free
            kept = kept_exchange_port(self.config.data_dir) if chosen == 0 else None
            try:
                try:
                    await exchange_port.start(self.config.host, kept or chosen, tls)
                except OSError:
                    if kept is None:
                        raise
                    log.info("the Exchange port kept from the last start, %d, is taken; "
                             "choosing another", kept)  # fmt: skip
                    await exchange_port.start(self.config.host, 0, tls)
                if chosen == 0:
                    keep_exchange_port(self.config.data_dir, exchange_port.port)
            except BaseException:
                if self._v2 is not None:
                    await self._v2.stop(0)
                    self._v2 = None
                await server.stop(None)
                raise
            self.exchange_port = exchange_port
            state.exchange_address = self.exchange_address or ""
            log.info("ordermq Exchange over framed TCP on %s", self.exchange_address)
        await server.start()
        scheduler.start()
        transactions.start()
        pop.start()
        self._sweeper = asyncio.create_task(self._expire_clients(state), name="client-expiry")
        self._lag_probe = asyncio.create_task(self.loop_lag.run(), name="loop-lag-probe")
        if self.acl is not None and self.config.acl_file is not None:
            from mockbroker.acl import AclWatcher

            watcher = AclWatcher(
                self.acl, self.config.acl_file, self.clock, self.config.acl_reload_seconds
            )
            self._acl_watcher = asyncio.create_task(watcher.run(), name="acl-watcher")
            log.info("ACL of %s in force: %d accounts", self.config.acl_file,
                     len(self.acl.rules.accounts))  # fmt: skip
        self.state, self._server = state, server
        if self.config.remoting_port is not None:
            from mockbroker.fronts.remoting.front import RemotingFront
            from mockbroker.registrar import BrokerRegistrar

            self.remoting = RemotingFront(
                state, self._client_host(),
                max_connections=self.config.remoting_max_connections,
                max_connections_per_host=self.config.remoting_max_connections_per_host,
                acl=self.acl,
            )  # fmt: skip
            await self.remoting.start(
                self.config.host, self.config.remoting_port, self.config.namesrv_port,
                self.tls.ssl_context() if self.tls is not None else None,
            )  # fmt: skip
            log.info("RocketMQ remoting on %s, name server on %s",
                     self.remoting.broker_address, self.remoting.namesrv_address)  # fmt: skip
            name_servers = self.config.name_servers()
            if name_servers:
                remoting = self.remoting
                self.registrar = BrokerRegistrar(
                    state, name_servers, lambda: remoting.broker_address or "", self.clock,
                    cluster=self.config.cluster_name,
                    register_seconds=self.config.register_seconds,
                )  # fmt: skip
                await self.registrar.start()
        if self.config.console_port is not None:
            from mockbroker.fronts.console import ConsoleServer  # only where it is asked for
            from mockbroker.fronts.console.data_path import DataPath

            self._console = ConsoleServer(
                admin, self._front_addresses, self._interface(self.config.console_host),
                self.config.console_port,
                tls=self.tls.ssl_context() if self.tls is not None else None, acl=self.acl,
                data_path=DataPath(lambda: self.address, *self._console_client_tls()),
            )  # fmt: skip
            log.info("console on %s://%s/", "https" if self.tls else "http",
                     self.console_address)  # fmt: skip
        log.info("broker %s (ordermq %s) serving on %s%s", self.config.broker_name, __version__,
                 self.address, " over TLS" if self.tls else "")  # fmt: skip
        self._warn_if_open()

    def _console_client_tls(self) -> tuple[TLSConfig | None, str]:
        """How the console connects to this broker as a client; why it cannot, if it cannot."""
        if self.config.tls_cert is None:
            return None, ""
        if self.config.tls_client_ca is not None:
            return None, ("the broker requires client certificates, which the console has "
                          "none of: resend dead letters with `ordermq dlq resend`")  # fmt: skip
        return TLSConfig(ca_file=self.config.tls_cert), ""

    def _front_addresses(self) -> list[tuple[str, str]]:
        """Each front that is on, with the address it serves (for the console)."""
        fronts = [("ordermq gRPC and admin", self.address)]
        if self.v2_address is not None:
            fronts.append(("RocketMQ 5 gRPC", self.v2_address))
        if self.exchange_address is not None:
            fronts.append(("ordermq Exchange (framed TCP)", self.exchange_address))
        if self.remoting is not None:
            fronts.append(("RocketMQ remoting", self.remoting.broker_address or "-"))
            if self.remoting.namesrv_address is not None:
                fronts.append(("RocketMQ name server", self.remoting.namesrv_address))
        if self.metrics_address is not None:
            fronts.append(("metrics and health checks", self.metrics_address))
        if self.console_address is not None:
            fronts.append(("console", self.console_address))
        return fronts

    def _metrics_host(self) -> str:
        return self._interface(self.config.metrics_host)

    def _interface(self, configured: str | None) -> str:
        """A page's interface: as configured, else loopback (`host` if it is loopback)."""
        if configured is None:
            return self.config.host if _is_loopback(self.config.host) else "127.0.0.1"
        return configured

    def _warn_if_open(self) -> None:
        """One warning naming the ports served in plain text beyond this machine."""
        if self.tls is not None:
            return
        ports = []
        if not _is_loopback(self.config.host):
            ports.append(f"ordermq gRPC and admin {self.port}")
            if self._v2 is not None:
                ports.append(f"RocketMQ 5 {self._v2.port}")
            if self.exchange_port is not None:
                ports.append(f"ordermq Exchange {self.exchange_port.port}")
            if self.remoting is not None:
                for name, server in (("remoting", self.remoting.broker),
                                     ("name server", self.remoting.namesrv)):  # fmt: skip
                    if server is not None:
                        ports.append(f"RocketMQ {name} {server.port}")
        if self._http is not None and not _is_loopback(self._metrics_host()):
            ports.append(f"metrics {self._http.port}")
        if self._console is not None and not _is_loopback(
            self._interface(self.config.console_host)
        ):
            ports.append(f"console {self._console.port}")
        if ports:
            log.warning(
                "serving in plain text, without TLS, beyond this machine: %s; anyone who "
                "reaches them can read and write messages (--tls-cert and --tls-key turn "
                "TLS on)",
                ", ".join(ports),
            )

    def reload_tls(self) -> None:
        """Read the TLS files again (SIGHUP); new connections get the new certificate.

        TLSCertificateError, and the old certificate kept, if the files are not good;
        ValueError when the broker serves without TLS.
        """
        if self.tls is None:
            raise ValueError("the broker serves without TLS: there is nothing to reload")
        self.tls.reload()

    def _sliced_store(self) -> SlicedStore | None:
        config = self.config
        if not config.fair_scheduling:
            return None
        scheduler = FairScheduler(
            turn_seconds=config.fair_turn_ms / 1000, timer=self.clock.monotonic
        )
        return SlicedStore(
            self.store,
            scheduler,
            slice_messages=config.fair_slice_messages,
            slice_bytes=config.fair_slice_bytes,
        )

    async def expire_client(self, client_id: str) -> int:
        """Forget a client now, as the broker does one silent past `client_timeout_seconds`.

        It leaves its groups (their other members rebalance) and its queue locks are
        released. Returns how many locks were released; ValueError for a client the
        broker does not know. For tests of what happens when a consumer is lost.
        """
        state = self.state
        if state is None:
            raise RuntimeError("the broker is not serving")
        if not state.groups.unregister(client_id):
            raise ValueError(f"no client {client_id!r} is known to the broker")
        dropped = await release_gone(state.locks, {client_id: "on request"})
        await state.locks.save()
        return dropped

    async def _expire_clients(self, state: BrokerState) -> None:
        while True:
            await sleep_for(self.clock, _EXPIRY_SWEEP_SECONDS)
            stats = state.store.stats
            state.rates.sample(self.clock.now(), stats.messages_stored, stats.messages_served)
            await release_gone(state.locks, state.groups.expire())
            try:
                await state.locks.save()
            except BrokerError as exc:
                log.error("%s (retried with the next change)", exc.message)

    async def stop(self, grace_seconds: float = 5.0) -> None:
        """Answer held pulls, stop serving (running calls get a bounded grace), close.

        The grace is one for all the fronts, not one each: calls still running when it is
        over are cancelled, so a stop takes the grace and a few seconds, whatever peers do.
        """
        deadline = asyncio.get_running_loop().time() + grace_seconds

        def left() -> float:
            return max(0.0, deadline - asyncio.get_running_loop().time())

        self._stopping = True  # /readyz answers 503 from now on, /metrics still works
        if self._messaging is not None:
            self._messaging.exchanges.close()  # each ends once its requests are answered
        if self._v2 is not None:
            self._v2.close()  # Telemetry streams end
        if self.state is not None:
            self.state.holder.close()
            self.state.groups.close()
            self.state.transactions.close()
            await self.state.scheduler.stop()
            await self.state.transactions.stop()
        if self.registrar is not None:
            await self.registrar.stop()  # clients stop routing here before the ports close
            self.registrar = None
        if self.remoting is not None:
            await self.remoting.stop(left())  # held pulls, just answered, write out
        if self._acl_watcher is not None:
            self._acl_watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._acl_watcher
            self._acl_watcher = None
        for task in (self._sweeper, self._lag_probe):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.state is not None:
            # The sweep, cancelled between the turns of its releases' save, leaves them
            # unwritten: without this the next start would hold the gone clients' locks
            # for a lease.
            try:
                await self.state.locks.save()
            except BrokerError as exc:
                log.error("%s (the lock table on disk is older than the broker's)", exc.message)
        if self._v2 is not None:
            await self._v2.stop(left())
            self._v2 = None
        if self.exchange_port is not None:
            await self.exchange_port.stop(left())  # its streams were closed above
            self.exchange_port = None
        if self._server is not None:
            await self._server.stop(left())
            self._server = None
        if self.state is not None:
            await self.state.pop.stop()  # after the last ack, before the store closes
        await self._close_http()
        if self._console is not None:
            await asyncio.to_thread(self._console.close)  # pages in flight need this loop
            self._console = None
        await self.store.close()
        log.info("broker %s stopped", self.config.broker_name)

    async def _close_http(self) -> None:
        if self._http is not None:
            # In a thread: closing waits for the server's poll loop, and scrapes in
            # flight need this loop to finish.
            await asyncio.to_thread(self._http.close)
            self._http = None
