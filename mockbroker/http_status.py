"""The broker's HTTP endpoint: Prometheus metrics and health checks on `--metrics-port`.

    /metrics  Prometheus metrics, in the text format or OpenMetrics as the scraper asks
              (mockbroker/metrics.py takes them, mockbroker/exposition.py writes them)
    /healthz  liveness: 200 whenever the process answers HTTP
    /readyz   readiness: 200 once the store is recovered and accepts writes; otherwise
              503 and the reason (starting, recovering, a failed write or fsync, stopping)
    /         a short index of the above; any other path is 404

It starts before the store is opened, so that a long recovery is seen as "alive, not
ready" rather than as a process that does not answer.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client.exposition import ThreadingWSGIServer

from mockbroker.exposition import MetricsPage
from mockbroker.metrics import BrokerCollector
from mockbroker.tls import HANDSHAKE_TIMEOUT_SECONDS

if TYPE_CHECKING:
    from mockbroker.server import Broker

#: How long /readyz waits for the broker's event loop to answer; a loop that cannot
#: answer this fast is not ready to serve either.
READINESS_TIMEOUT_SECONDS = 5.0

INDEX = """\
ordermq broker
/metrics  Prometheus metrics
/healthz  liveness: 200 while the process serves HTTP
/readyz   readiness: 200 once the store is recovered and accepts writes, else 503 and why
"""

Readiness = Callable[[], str | None]


class StatusApp:
    """The WSGI application: routes to metrics, liveness, readiness and the index."""

    def __init__(self, metrics: WSGIApplication, readiness: Readiness) -> None:
        self._metrics = metrics
        self._readiness = readiness

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """Answer one request."""
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return _text(start_response, "405 Method Not Allowed", "only GET and HEAD\n",
                         head=False, extra=[("Allow", "GET, HEAD")])  # fmt: skip
        head = method == "HEAD"
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self._metrics(environ, start_response)
        if path == "/healthz":
            return _text(start_response, "200 OK", "ok\n", head=head)
        if path == "/readyz":
            why = self._readiness()
            if why is None:
                return _text(start_response, "200 OK", "ready\n", head=head)
            return _text(start_response, "503 Service Unavailable", f"not ready: {why}\n",
                         head=head)  # fmt: skip
        if path == "/":
            return _text(start_response, "200 OK", INDEX, head=head)
        return _text(start_response, "404 Not Found", f"no such page: {path}\n{INDEX}", head=head)


def _text(
    start_response: StartResponse,
    status: str,
    body: str,
    *,
    head: bool,
    extra: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    data = body.encode()
    start_response(
        status,
        [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(data))),
            ("Cache-Control", "no-store"),
            *(extra or []),
        ],
    )
    return [] if head else [data]


def readiness_on_loop(broker: Broker, loop: asyncio.AbstractEventLoop) -> Readiness:
    """broker.readiness(), asked on the broker's loop (the loop owns the broker's state)."""

    async def ask() -> str | None:
        return broker.readiness()

    def readiness() -> str | None:
        question = ask()
        try:
            future = asyncio.run_coroutine_threadsafe(question, loop)
        except RuntimeError:  # the loop is closed
            question.close()
            return "the broker is not running"
        try:
            return future.result(timeout=READINESS_TIMEOUT_SECONDS)
        except TimeoutError:
            future.cancel()
            return f"the broker's event loop did not answer within {READINESS_TIMEOUT_SECONDS:g} s"

    return readiness


class QuietHandler(WSGIRequestHandler):
    """No access log on stderr: probes come every few seconds."""

    def log_message(self, format: str, *args: object) -> None:
        """Drop the line."""


def server_class(host: str, port: int, tls: ssl.SSLContext | None) -> type[ThreadingWSGIServer]:
    """The server class for `host`'s address family (IPv6 hosts need AF_INET6), and TLS."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)

    class Server(ThreadingWSGIServer):
        address_family = infos[0][0]

        def get_request(self) -> tuple[socket.socket, Any]:
            connection, address = super().get_request()
            if tls is None:
                return connection, address
            # The handshake happens on the first read, in the request's own thread: a
            # peer that never finishes it holds that thread, not the accepting one.
            connection.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
            wrapped = tls.wrap_socket(connection, server_side=True, do_handshake_on_connect=False)
            return wrapped, address

        def handle_error(self, request: Any, client_address: Any) -> None:
            if not isinstance(sys.exc_info()[1], ssl.SSLError | TimeoutError):
                super().handle_error(request, client_address)  # a failed handshake: quiet

    return Server


class WSGIThread:
    """A WSGI application served in a daemon thread (a thread per request), with TLS if given."""

    def __init__(
        self,
        app: WSGIApplication,
        host: str,
        port: int,
        tls: ssl.SSLContext | None,
        *,
        what: str,
        thread_name: str,
    ) -> None:
        host = host.strip("[]")  # "[::]" as gRPC spells it
        try:
            self._server = make_server(
                host, port, app, server_class=server_class(host, port, tls),
                handler_class=QuietHandler,
            )  # fmt: skip
        except OSError as exc:
            raise OSError(f"cannot serve {what} on {host}:{port}: {exc.strerror or exc}") from exc
        self.port = int(self._server.server_port)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=thread_name, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class StatusServer(WSGIThread):
    """Serves StatusApp for one broker in a daemon thread."""

    def __init__(
        self, broker: Broker, host: str, port: int, tls: ssl.SSLContext | None = None
    ) -> None:
        loop = asyncio.get_running_loop()
        app = StatusApp(MetricsPage(BrokerCollector(broker), loop), readiness_on_loop(broker, loop))
        super().__init__(app, host, port, tls, what="metrics and health checks",
                         thread_name="ordermq-http-status")  # fmt: skip
