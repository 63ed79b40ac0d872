"""ConsoleServer: the console's WSGI application in a daemon thread, on its own port."""

from __future__ import annotations

import asyncio
import ssl

from mockbroker.acl import Acl
from mockbroker.fronts.console.admin_calls import AdminCalls
from mockbroker.fronts.console.data_path import DataPath
from mockbroker.fronts.console.pages import ConsoleApp, Fronts
from mockbroker.fronts.grpc.admin_service import AdminService
from mockbroker.http_status import WSGIThread


class ConsoleServer(WSGIThread):
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
        super().__init__(self.app, host, port, tls, what="the console",
                         thread_name="ordermq-console")  # fmt: skip
