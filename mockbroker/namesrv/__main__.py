"""`python -m mockbroker.namesrv`: a standalone RocketMQ name server.

Brokers started with `--namesrv-addr` register with it; RocketMQ's clients and ordermq's
`rocketmq://` transport ask it for routes. It prints one ready line,
`mockbroker name server listening on HOST:PORT`, and stops cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from mockbroker.namesrv.server import SCAN_SECONDS, NameServer
from sdk._validation import finite_number, host_problem


def port_number(text: str) -> int:
    """A TCP port, 0..65535 (0: a free one); a usage error names the value otherwise.

    Out of range, it used to reach the socket's bind() and end in a traceback.
    """
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is outside 0..65535")
    return port


def host_name(text: str) -> str:
    """An address or host name the socket layer can take; a usage error names it otherwise.

    A control character or what IDNA cannot encode (a NUL, a label over 63 characters)
    used to reach getaddrinfo and end in a ValueError or UnicodeError traceback.
    """
    problem = host_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} is no host name or address: {problem}")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m mockbroker.namesrv", description="A RocketMQ name server."
    )
    p.add_argument(
        "--host",
        type=host_name,
        default="127.0.0.1",
        help="address to listen on (default %(default)s)",
    )
    p.add_argument(
        "--port",
        type=port_number,
        default=9876,
        help="port, 0 for a free one (default %(default)s)",
    )
    p.add_argument(
        "--scan-seconds",
        type=float,
        default=SCAN_SECONDS,
        help="how often brokers silent past their timeout (120 s) are dropped "
        "(default %(default)s)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


async def serve(host: str, port: int, scan_seconds: float) -> None:
    """Serve until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = NameServer(scan_seconds=scan_seconds)
    await server.start(host, port)
    print(f"mockbroker name server listening on {server.address}", flush=True)
    await stop.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    a = build_parser().parse_args(argv)
    if not (finite_number(a.scan_seconds) and a.scan_seconds > 0):
        build_parser().error(
            f"--scan-seconds must be a finite number above 0, not {a.scan_seconds}"
        )
    logging.basicConfig(
        level=a.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )  # fmt: skip
    try:
        asyncio.run(serve(a.host, a.port, a.scan_seconds))
    except OSError as exc:  # the port is in use, or the address is not this machine's
        print(f"mockbroker name server: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
