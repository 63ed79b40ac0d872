"""Pop: receive with an invisible duration, ack, change invisible duration (RocketMQ 5).

The core every front calls (ordermq's gRPC, RocketMQ's apache.rocketmq.v2); see
service.py for the rules, window.py for one group's state on one queue, journal.py for
its durability and receipts.py for the receipt handles.
"""

from mockbroker.pop.service import (
    MAX_INVISIBLE_MS,
    MAX_RECEIVE_MESSAGES,
    MAX_WAIT_MS,
    PopPolicy,
    PopProgress,
    PopService,
    Received,
    Renewed,
)

__all__ = [
    "MAX_INVISIBLE_MS",
    "MAX_RECEIVE_MESSAGES",
    "MAX_WAIT_MS",
    "PopPolicy",
    "PopProgress",
    "PopService",
    "Received",
    "Renewed",
]
