"""What pop groups did since the broker started, counted where the pop core does it.

Plain counters by (group, topic), read by the metrics page (mockbroker/metrics.py) at
scrape time; nothing here knows a wire format. They start at zero with the broker: the
journal's replay after a restart counts nothing again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

#: (group, topic)
GroupTopic = tuple[str, str]


@dataclass
class PopStats:
    """Messages each pop group received, acked, let expire and dead-lettered, by topic."""

    #: Deliveries answered to receives (a re-delivery counts again).
    received: Counter[GroupTopic] = field(default_factory=Counter)
    #: Acks that settled a message (a repeated ack counts once).
    acked: Counter[GroupTopic] = field(default_factory=Counter)
    #: Leases whose invisible time ran out without an ack: the message became visible
    #: again (to be delivered again, or dead-lettered after its last attempt).
    expired: Counter[GroupTopic] = field(default_factory=Counter)
    #: Messages moved to %DLQ%<group>: after their last attempt, or forwarded by a client.
    dead_lettered: Counter[GroupTopic] = field(default_factory=Counter)
