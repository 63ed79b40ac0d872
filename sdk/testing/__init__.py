"""Test helpers for applications that use ordermq.

- `FakeClock`: time that moves only when a test advances it; give it to a broker and
  to clients instead of sleeping through leases, delays and expiry.
- `TestBroker`: an ordermq broker in the test's own process, on a free port and its own
  data directory, that a test can restart (same address, same data) and tell to lose a
  client, as it loses one that went silent.
- `OrderRecorder`: an orderly listener that records what it handles (and may pass each
  message on to the application's handler), and checks that every key's messages were
  handled in the order they were sent, none lost, at most so many repeated.
- `paused(client)`: a blocking client frozen for a `with` block, as SIGSTOP or a long GC
  pause freezes a process; with a shared `FakeClock`, paused past its lease.

So an application tests its listeners under the faults ordermq tests its own under
(examples/testing_kit.py).
"""

from __future__ import annotations

from sdk.testing.broker import TestBroker
from sdk.testing.clock import FakeClock
from sdk.testing.pausing import paused
from sdk.testing.recording import (
    Handled,
    OrderRecorder,
    assert_handled_in_order,
    order_problems,
)

__all__ = [
    "FakeClock",
    "Handled",
    "OrderRecorder",
    "TestBroker",
    "assert_handled_in_order",
    "order_problems",
    "paused",
]
