"""ConsoleServer: the console's WSGI application in a daemon thread, on its own port."""

from __future__ import annotations

import asyncio
import ssl
import threading
from wsgiref.simple_server import make_server

from mockbroker.acl import Acl
from mockbroker.fronts.console.admin_calls import AdminCalls
from mockbroker.fronts.console.data_path import DataPath
from mockbroker.fronts.console.pages import ConsoleApp, Fronts
from mockbroker.fronts.grpc.admin_service import AdminService
from mockbroker.http_status import QuietHandler, server_class


class ConsoleServer:
    """Serves the console for one broker (call from the broker's event loop).

    `data_path` is the console's client of the broker, for resending dead letters and
    searching by sharding key (default: plain gRPC to the first of `fronts`).
    """

    def __init__(
        self,
        admin: AdminService,
        fronts: Fronts,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
        acl: Acl | None = None,
        data_path: DataPath | None = None,
    ) -> None:
        calls = AdminCalls(admin, asyncio.get_running_loop())
        if data_path is None:  # the first front is the broker's ordermq gRPC
            data_path = DataPath(lambda: fronts()[0][1])
        self.app = ConsoleApp(calls, fronts, acl, data_path)
        host = host.strip("[]")
        try:
            self._server = make_server(
                host, port, self.app, server_class=server_class(host, port, tls),
                handler_class=QuietHandler,
            )  # fmt: skip
        except OSError as exc:
            raise OSError(
                f"cannot serve the console on {host}:{port}: {exc.strerror or exc}"
            ) from exc
        self.port = int(self._server.server_port)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ordermq-console", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
