"""The gRPC broker client's reading of answers (sdk/_transport/broker_client.py)."""

from __future__ import annotations

import pytest

from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._transport.broker_client import _pull_result
from sdk._transport.protocol import PullStatus
from sdk.errors import BrokerError


def test_a_pull_status_the_client_does_not_know_is_an_ordermq_error() -> None:
    """It was a ValueError: the push loop, which ends a subscription on an OrderMQError
    and subscribes again, would have died with it, that queue's delivery stopped unseen."""
    with pytest.raises(BrokerError, match="status 99, which this client does not know"):
        _pull_result(pb.PullResponse(status=99), b"", "broker-a")  # type: ignore[arg-type]
    found = _pull_result(pb.PullResponse(status=pb.NO_NEW_MESSAGE, next_offset=7), b"", "broker-a")
    assert (found.status, found.next_offset, found.messages) == (PullStatus.NO_NEW_MESSAGE, 7, [])
