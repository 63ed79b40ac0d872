"""`python -m mockbroker`: serve a broker until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path

from mockbroker.config import BrokerConfig
from mockbroker.server import Broker
from sdk.log import JsonFormatter


def parse_args(argv: list[str] | None = None) -> BrokerConfig:
    """Build a BrokerConfig from command-line arguments."""
    d = BrokerConfig()
    p = argparse.ArgumentParser(prog="mockbroker", description="Run an ordermq broker.")
    p.add_argument("--host", default=d.host, help="interface to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=d.port, help="TCP port; 0 picks a free one")
    p.add_argument(
        "--advertised-host",
        default=None,
        help="host clients are told to connect to (default: --host, or 127.0.0.1 for 0.0.0.0)",
    )
    p.add_argument("--data-dir", type=Path, required=True, help="where messages are stored")
    p.add_argument("--flush-mode", choices=["async", "sync"], default=d.flush_mode)
    p.add_argument("--lock-lease-seconds", type=float, default=d.lock_lease_seconds)
    p.add_argument("--default-queues", type=int, default=d.default_queues)
    p.add_argument("--broker-name", default=d.broker_name)
    p.add_argument("--segment-bytes", type=int, default=d.segment_bytes)
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
        "--no-auto-create-topics",
        action="store_true",
        help="refuse sends to topics that were not created explicitly",
    )
    p.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port"
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
        help="most messages one slice of store work appends or reads (default %(default)s)",
    )
    p.add_argument(
        "--fair-slice-bytes",
        type=int,
        default=d.fair_slice_bytes,
        help="most bytes one slice of store work appends or reads (default %(default)s)",
    )
    p.add_argument(
        "--fair-turn-ms",
        type=float,
        default=d.fair_turn_ms,
        help="store work done before the event loop goes round to see who else waits "
        "(default %(default)s)",
    )
    p.add_argument(
        "--client-max-in-flight-bytes",
        type=int,
        default=d.client_max_in_flight_bytes,
        help="bytes of one client's requests and answers held at once; past it the "
        "client's further requests wait (default %(default)s)",
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument(
        "--log-format", choices=["text", "json"], default="text", help="json: one object a line"
    )
    a = p.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if a.log_format == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    logging.basicConfig(level=a.log_level.upper(), handlers=[handler])
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
            metrics_port=a.metrics_port,
            advertised_host=a.advertised_host,
            fair_scheduling=not a.no_fair_scheduling,
            fair_slice_messages=a.fair_slice_messages,
            fair_slice_bytes=a.fair_slice_bytes,
            fair_turn_ms=a.fair_turn_ms,
            client_max_in_flight_bytes=a.client_max_in_flight_bytes,
        )
    except ValueError as exc:
        p.error(str(exc))


async def serve(config: BrokerConfig) -> None:
    """Serve until SIGTERM or SIGINT, then shut down cleanly."""
    broker = Broker(config)
    await broker.start()
    # What exists now lives as long as the process: keep it out of the collector's full
    # passes, which otherwise stall the loop for milliseconds each (more often the more
    # clients send: a flood triggers them several times a second).
    gc.collect()
    gc.freeze()
    print(f"mockbroker listening on {broker.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.stop()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    config = parse_args(argv)
    try:
        asyncio.run(serve(config))
    except OSError as exc:
        print(f"mockbroker: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
