"""`python -m mockbroker`: serve a broker until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import logging
import resource
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from mockbroker.busy_poll import (
    BusyPollSelector,
    PollingEventLoop,
    ThreadWork,
    available_cores,
)
from mockbroker.config import BrokerConfig
from mockbroker.server import Broker
from mockbroker.tls import TLSCertificateError
from sdk._version import __version__
from sdk._wire import DEFAULT_PORT
from sdk.errors import CorruptFileError
from sdk.log import JsonFormatter


def _port_or_off(text: str) -> int | None:
    """A port number, or None for 'off'."""
    if text == "off":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number or 'off'") from None


def data_directory(text: str) -> Path:
    """The data directory's path; empty text is a usage error.

    Path("") is the current directory: an empty --data-dir (an unset shell variable)
    stored the broker's files wherever the command happened to run.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} names no directory")
    return Path(text)


def build_parser() -> argparse.ArgumentParser:
    """The command line's options; every one has help, defaults from BrokerConfig."""
    d = BrokerConfig()
    p = argparse.ArgumentParser(prog="mockbroker", description="Run an ordermq broker.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--host", default=d.host, help="interface to listen on (default %(default)s)")
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="TCP port (default %(default)s, where the ordermq command looks); 0 picks a free one",
    )
    p.add_argument(
        "--advertised-host",
        default=None,
        help="host clients are told to connect to (default: --host, or 127.0.0.1 for 0.0.0.0)",
    )
    p.add_argument(
        "--data-dir", type=data_directory, required=True, help="where messages are stored"
    )
    p.add_argument(
        "--flush-mode",
        choices=["async", "sync"],
        default=d.flush_mode,
        help="async: answer sends before their fsync (at most every "
        f"{d.flush_interval_seconds:g} s); sync: only after it (default %(default)s)",
    )
    p.add_argument(
        "--lock-lease-seconds",
        type=float,
        default=d.lock_lease_seconds,
        help="how long an orderly consumer's queue lock lives without renewal "
        "(default %(default)s)",
    )
    p.add_argument(
        "--default-queues",
        type=int,
        default=d.default_queues,
        help="queue count of a topic created by its first send (default %(default)s)",
    )
    p.add_argument(
        "--broker-name",
        default=d.broker_name,
        help="the name queues report as their broker (default %(default)s)",
    )
    p.add_argument(
        "--segment-bytes",
        type=int,
        default=d.segment_bytes,
        help="size in bytes at which the commit log rolls to a new file (default %(default)s)",
    )
    p.add_argument(
        "--client-timeout-seconds",
        type=float,
        default=d.client_timeout_seconds,
        help="a silent client leaves its groups after this long (default %(default)s)",
    )
    p.add_argument(
        "--disconnect-grace-seconds",
        type=float,
        default=d.disconnect_grace_seconds,
        help="a client whose connection closed leaves its groups and loses its locks after "
        "this long without a heartbeat (default %(default)s)",
    )
    p.add_argument(
        "--keepalive-seconds",
        type=float,
        default=d.keepalive_seconds,
        help="ping a client connection quiet for this long; close it when the ping is not "
        "answered within as long (default %(default)s)",
    )
    p.add_argument(
        "--no-auto-create-topics",
        action="store_true",
        help="refuse sends to topics that were not created explicitly",
    )
    p.add_argument(
        "--remoting-port",
        type=int,
        default=None,
        help="serve RocketMQ 4.x remoting, for RocketMQ's own clients, on this port "
        "(default: off; 0 picks a free one; RocketMQ uses 10911)",
    )
    p.add_argument(
        "--namesrv-port",
        type=int,
        default=None,
        help="serve a RocketMQ name server routing to the remoting port "
        "(default: off; needs --remoting-port; RocketMQ uses 9876)",
    )
    p.add_argument(
        "--namesrv-addr",
        default=None,
        help="register with these name servers, host:port separated by ';' (default: "
        "none; needs --remoting-port; start them with python -m mockbroker.namesrv)",
    )
    p.add_argument(
        "--cluster-name",
        default=d.cluster_name,
        help="the cluster the broker registers in (default %(default)s)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics on this port (default: off; 0 picks a free one)",
    )
    p.add_argument(
        "--exchange-port",
        type=_port_or_off,
        default=d.exchange_port,
        help="also serve ordermq's Exchange stream (sends, pulls, push delivery) over "
        "framed TCP on this port; routes name it, and ordermq's clients use it where they "
        "can reach it (default 0: a free one; 'off': none)",
    )
    p.add_argument(
        "--v2-port",
        type=int,
        default=None,
        help="also serve RocketMQ 5's gRPC API (apache.rocketmq.v2, the official RocketMQ 5 "
        "clients) on this port (default: off; 0 picks a free one)",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="least severe log records written to stderr (default %(default)s)",
    )
    p.add_argument(
        "--retention-hours",
        type=float,
        default=d.retention_hours,
        help="commit-log segments older than this are deleted (default %(default)s)",
    )
    p.add_argument(
        "--disk-high-ratio",
        type=float,
        default=d.disk_high_ratio,
        help="above this share of the disk in use, the oldest segments every group has "
        "read are deleted early (default %(default)s)",
    )
    p.add_argument(
        "--disk-force-ratio",
        type=float,
        default=d.disk_force_ratio,
        help="above this share, the oldest segments go early read or not, as many as it "
        "takes at once (default %(default)s)",
    )
    p.add_argument(
        "--disk-refuse-ratio",
        type=float,
        default=d.disk_refuse_ratio,
        help="above this share, sends are refused (DISK_FULL) (default %(default)s)",
    )
    p.add_argument(
        "--disk-check-seconds",
        type=float,
        default=d.disk_check_seconds,
        help="how often disk use is checked and retention applied (default %(default)s)",
    )
    p.add_argument(
        "--max-data-bytes",
        type=int,
        default=None,
        help="a cap on the commit log's bytes: above it the oldest segments go, read or "
        "not, and sends are refused while it cannot be met (default: no cap)",
    )
    p.add_argument(
        "--disk-usage-file",
        type=Path,
        default=None,
        help="for tests: simulate the disk from this JSON file "
        '({"total_bytes": N, "other_used_bytes": M})',
    )
    p.add_argument(
        "--no-fair-scheduling",
        action="store_true",
        help="serve each request's store work whole, in order of arrival, instead of in "
        "slices taken in turns between clients (one flooding client then slows the others)",
    )
    p.add_argument(
        "--fair-slice-messages",
        type=int,
        default=d.fair_slice_messages,
        help="most messages one slice of store work checks or reads (default %(default)s)",
    )
    p.add_argument(
        "--fair-slice-bytes",
        type=int,
        default=d.fair_slice_bytes,
        help="most bytes one slice of store work checks or reads (default %(default)s)",
    )
    p.add_argument(
        "--fair-turn-ms",
        type=float,
        default=d.fair_turn_ms,
        help="store work done before the event loop goes round to see who else waits "
        "(default %(default)s)",
    )
    p.add_argument(
        "--busy-poll-us",
        type=int,
        default=d.busy_poll_us,
        help="microseconds the event loop polls before it sleeps while requests come that "
        "densely, so that they need not wake it (default %(default)s; 0: off)",
    )
    p.add_argument(
        "--remoting-max-connections",
        type=int,
        default=d.remoting_max_connections,
        help="connections the remoting port and the name server each keep open at once "
        "(default %(default)s)",
    )
    p.add_argument(
        "--remoting-max-connections-per-host",
        type=int,
        default=d.remoting_max_connections_per_host,
        help="of those, how many one remote address may have (default %(default)s)",
    )
    p.add_argument(
        "--client-max-in-flight-bytes",
        type=int,
        default=d.client_max_in_flight_bytes,
        help="bytes of one client's requests and answers held at once; past it the "
        "client's further requests wait (default %(default)s)",
    )
    p.add_argument(
        "--client-max-locks",
        type=int,
        default=d.client_max_locks,
        help="queue locks one client may hold at once, over every group; a lock request "
        "past it is refused (default %(default)s)",
    )
    p.add_argument(
        "--max-topics",
        type=int,
        default=d.max_topics,
        help="topics the broker holds at most (its own and retry topics included); "
        "creating one more is refused (default %(default)s)",
    )
    p.add_argument(
        "--client-max-topics",
        type=int,
        default=d.client_max_topics,
        help="topics one client (connection) may have the broker create, by sends, route "
        "queries and heartbeats (a retry topic per group); past it refused (default %(default)s)",
    )
    p.add_argument(
        "--fifo-group",
        action="append",
        default=[],
        metavar="GROUP",
        help="a consumer group that receives FIFO (RocketMQ 5 clients; repeat for several)",
    )
    p.add_argument(
        "--pop-max-in-flight",
        type=int,
        default=d.pop_max_in_flight,
        help="per group and queue, the most received messages not yet acknowledged "
        "(or held back behind them); past it receives answer fewer (default %(default)s)",
    )
    p.add_argument(
        "--pop-max-delivery-attempts",
        type=int,
        default=d.pop_max_delivery_attempts,
        help="deliveries of a received message before it goes to %%DLQ%%<group> "
        "(default %(default)s)",
    )
    p.add_argument(
        "--transaction-timeout-seconds",
        type=float,
        default=d.transaction_timeout_seconds,
        help="check back a transaction not ended this long after its half message was "
        "stored (default %(default)s)",
    )
    p.add_argument(
        "--transaction-check-seconds",
        type=float,
        default=d.transaction_check_seconds,
        help="check back a transaction still unknown this often (default %(default)s)",
    )
    p.add_argument(
        "--transaction-max-checks",
        type=int,
        default=d.transaction_max_checks,
        help="check-backs of a transaction before it is dropped (default %(default)s)",
    )
    p.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="PEM certificate chain: with --tls-key, every port is served over TLS only "
        "(re-read on SIGHUP)",
    )
    p.add_argument("--tls-key", type=Path, metavar="FILE", help="the certificate's PEM key")
    p.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="FILE",
        help="PEM CA certificate(s): clients must present a certificate signed by one (mutual TLS)",
    )
    p.add_argument(
        "--acl-file",
        type=Path,
        metavar="FILE",
        help="RocketMQ plain_acl.yml: every call (gRPC, admin, remoting broker port, RocketMQ 5 "
        "port) must be signed by an account and allowed by it (re-read when it changes)",
    )
    p.add_argument(
        "--metrics-host",
        help="interface of the metrics page (default: loopback, whatever --host is)",
    )
    p.add_argument(
        "--console-port",
        type=int,
        default=None,
        help="serve the console (pages: the broker, topics, groups, lag, offset resets, "
        "messages, dead letters) on "
        "this port (default: off; 0 picks a free one)",
    )
    p.add_argument(
        "--console-host",
        help="interface of the console (default: loopback, whatever --host is)",
    )
    p.add_argument(
        "--dedup-window-seconds",
        type=float,
        default=d.dedup_window_seconds,
        help="deduplicate sends: a message whose key (IDEMPOTENCY_KEY property, else its id) "
        "was stored on its topic this recently is answered with the first one's place; "
        "0: off (default %(default)s)",
    )
    p.add_argument(
        "--dedup-max-keys",
        type=int,
        default=d.dedup_max_keys,
        help="the most keys the dedup window keeps, oldest dropped first (default %(default)s)",
    )
    p.add_argument(
        "--log-format", choices=["text", "json"], default="text", help="json: one object a line"
    )
    return p


def parse_args(argv: list[str] | None = None) -> BrokerConfig:
    """Build a BrokerConfig from command-line arguments (and set up logging)."""
    p = build_parser()
    a = p.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if a.log_format == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    logging.basicConfig(level=a.log_level, handlers=[handler])
    try:
        return BrokerConfig(
            host=a.host,
            port=a.port,
            data_dir=a.data_dir,
            flush_mode=a.flush_mode,
            lock_lease_seconds=a.lock_lease_seconds,
            default_queues=a.default_queues,
            auto_create_topics=not a.no_auto_create_topics,
            broker_name=a.broker_name,
            segment_bytes=a.segment_bytes,
            client_timeout_seconds=a.client_timeout_seconds,
            disconnect_grace_seconds=a.disconnect_grace_seconds,
            keepalive_seconds=a.keepalive_seconds,
            metrics_port=a.metrics_port,
            remoting_port=a.remoting_port,
            namesrv_port=a.namesrv_port,
            namesrv_addr=a.namesrv_addr,
            cluster_name=a.cluster_name,
            remoting_max_connections=a.remoting_max_connections,
            remoting_max_connections_per_host=a.remoting_max_connections_per_host,
            advertised_host=a.advertised_host,
            retention_hours=a.retention_hours,
            disk_high_ratio=a.disk_high_ratio,
            disk_force_ratio=a.disk_force_ratio,
            disk_refuse_ratio=a.disk_refuse_ratio,
            disk_check_seconds=a.disk_check_seconds,
            max_data_bytes=a.max_data_bytes,
            disk_usage_file=a.disk_usage_file,
            fair_scheduling=not a.no_fair_scheduling,
            fair_slice_messages=a.fair_slice_messages,
            fair_slice_bytes=a.fair_slice_bytes,
            fair_turn_ms=a.fair_turn_ms,
            busy_poll_us=a.busy_poll_us,
            client_max_in_flight_bytes=a.client_max_in_flight_bytes,
            client_max_locks=a.client_max_locks,
            max_topics=a.max_topics,
            client_max_topics=a.client_max_topics,
            v2_port=a.v2_port,
            exchange_port=a.exchange_port,
            pop_max_in_flight=a.pop_max_in_flight,
            pop_max_delivery_attempts=a.pop_max_delivery_attempts,
            transaction_timeout_seconds=a.transaction_timeout_seconds,
            transaction_check_seconds=a.transaction_check_seconds,
            transaction_max_checks=a.transaction_max_checks,
            fifo_groups=tuple(a.fifo_group),
            tls_cert=a.tls_cert,
            tls_key=a.tls_key,
            tls_client_ca=a.tls_client_ca,
            acl_file=a.acl_file,
            metrics_host=a.metrics_host,
            console_port=a.console_port,
            console_host=a.console_host,
            dedup_window_seconds=a.dedup_window_seconds,
            dedup_max_keys=a.dedup_max_keys,
        )
    except ValueError as exc:
        p.error(str(exc))


async def serve(config: BrokerConfig) -> None:
    """Serve until SIGTERM or SIGINT, then shut down cleanly.

    The handlers are in place before the store opens: a signal during recovery, or right
    after the ready line, stops the broker cleanly once it has started.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    broker = Broker(config)
    loop.add_signal_handler(signal.SIGHUP, _reload_tls, broker)
    await broker.start()
    # What exists now lives as long as the process: keep it out of the collector's full
    # passes, which otherwise stall the loop for milliseconds each (more often the more
    # clients send: a flood triggers them several times a second).
    gc.collect()
    gc.freeze()
    print(f"mockbroker listening on {broker.address}", flush=True)  # the ready line: first
    for line in announcements(broker):
        print(line, flush=True)
    await stop.wait()
    await broker.stop()


def announcements(broker: Broker) -> list[str]:
    """The lines after the ready line: one per other front that is on, with its address.

    Printed so that a front given port 0 can be found: whoever starts the process reads
    the address here instead of choosing a free port beforehand, which another process may
    take before the broker binds it.
    """
    lines = []
    if broker.metrics_address is not None:
        lines.append(f"mockbroker serving metrics and health checks on {broker.metrics_address}")
    if broker.console_address is not None:
        lines.append(f"mockbroker serving the console on {broker.console_address}")
    if broker.v2_address is not None:
        lines.append(f"mockbroker serving RocketMQ 5 clients on {broker.v2_address}")
    if broker.exchange_address is not None:
        lines.append(f"mockbroker serving the Exchange port on {broker.exchange_address}")
    if broker.remoting is not None:
        lines.append(f"mockbroker serving RocketMQ remoting on {broker.remoting.broker_address}")
        if broker.remoting.namesrv_address is not None:
            lines.append(
                f"mockbroker serving a RocketMQ name server on {broker.remoting.namesrv_address}"
            )
    return lines


def _reload_tls(broker: Broker) -> None:
    """SIGHUP: re-read the TLS files (certificate rotation); never ends the process."""
    log = logging.getLogger("mockbroker")
    if broker.tls is None:
        log.info("SIGHUP ignored: %s", "not started yet" if broker.config.tls else "no TLS")
        return
    try:
        broker.reload_tls()
    except TLSCertificateError as exc:
        log.error("TLS files not reloaded, the old ones stay: %s", exc)


def raise_open_files_limit() -> None:
    """Raise the soft open-files limit to the hard one.

    Every queue keeps its index file open: a broker with a few hundred queues would hit
    the usual soft limit of 1 024 (servers such as Kafka and RocketMQ ask for the same).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            logging.getLogger("ordermq.broker").warning(
                "open-files limit stays at %d (cannot raise it to %d: %s)", soft, hard, exc
            )
            return
        logging.getLogger("ordermq.broker").info(
            "open-files limit raised from %d to %d", soft, hard
        )


def _acl_file_error() -> type[Exception]:
    """AclFileError, imported only once something has gone wrong.

    A broker without an ACL file never loads the ACL package (nor yaml).
    """
    from mockbroker.acl import AclFileError

    return AclFileError


def _broker_loop(
    config: BrokerConfig, cores: Callable[[], float] = available_cores
) -> asyncio.AbstractEventLoop:
    """The standalone broker's event loop: it polls before it sleeps (busy_poll.py).

    Only where it may use two cores or more (`cores`).
    """
    spin_us = config.busy_poll_us
    if spin_us and (usable := cores()) < 2:
        logging.getLogger("ordermq.broker").info(
            "busy polling off: %.3g core(s) to run on (--busy-poll-us needs 2 or more)", usable
        )
        spin_us = 0
    threads = ThreadWork()
    loop = PollingEventLoop(BusyPollSelector(spin_us / 1_000_000, may_spin=threads.idle))
    loop.set_default_executor(threads)
    return loop


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    config = parse_args(argv)
    raise_open_files_limit()
    try:
        with asyncio.Runner(loop_factory=functools.partial(_broker_loop, config)) as runner:
            runner.run(serve(config))
    except (OSError, CorruptFileError, TLSCertificateError, _acl_file_error()) as exc:
        # in use, no room, a data file unreadable, a TLS file that cannot be served with,
        # an ACL file with a fault (FILE:LINE)
        print(f"mockbroker: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
