"""The console's way to the broker's state: the AdminService's own methods, on its loop.

The console's WSGI threads call `AdminCalls.call("ListTopics", ...)`: the request runs on
the broker's event loop through the same method the `ordermq` command reaches over gRPC
(without the gRPC status translation), and its answer comes back as the dict the command's
`--json` prints. A refusal comes back as the BrokerError the gRPC front would send.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, cast

from google.protobuf import json_format
from google.protobuf.message import Message

from mockbroker.fronts.grpc.admin_service import AdminService
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._transport.codec import decode_records
from sdk.message import MessageExt

#: How long a page waits for the broker's loop to answer.
CALL_TIMEOUT_SECONDS = 10.0


class AdminCalls:
    """Calls AdminService methods on the broker's loop from other threads."""

    def __init__(self, admin: AdminService, loop: asyncio.AbstractEventLoop) -> None:
        self._admin = admin
        self._loop = loop

    def call(self, method: str, **fields: Any) -> dict[str, Any]:
        """Run AdminService.`method` with a request of `fields`; its answer as a dict.

        Raises the BrokerError the method refused with.
        """
        return self.call_fields(self._response(method, fields))

    def messages(self, method: str, **fields: Any) -> tuple[list[MessageExt], dict[str, Any]]:
        """Run a method that answers stored records: the messages, and its other fields."""
        response = self._response(method, fields)
        records = getattr(response, "records", b"")
        found = decode_records(records, "") if records else []
        rest = self.call_fields(response)
        rest.pop("records", None)
        return found, rest

    @staticmethod
    def call_fields(response: Message) -> dict[str, Any]:
        """`response` as the dict `call` answers."""
        return json_format.MessageToDict(
            response,
            always_print_fields_with_no_presence=True,
            preserving_proto_field_name=True,
            unquote_int64_if_possible=True,
        )

    def _response(self, method: str, fields: dict[str, Any]) -> Message:
        request = getattr(pb, f"{method}Request")(**fields)
        bound = getattr(self._admin, method)
        # The undecorated method: its BrokerError, not a gRPC abort on a context.
        handler = cast(Callable[..., Coroutine[Any, Any, Message]], bound.__wrapped__)
        future = asyncio.run_coroutine_threadsafe(handler(self._admin, request, None), self._loop)
        return future.result(CALL_TIMEOUT_SECONDS)
