"""sdk._speedups (sdk/_speedups.c), configured once, or None.

Messages encoded, batches grouped by queue, send results built, records decoded, frames
checked and records laid out in C. None where it was not built (no C compiler at install)
or does not fit this code (Message's or MessageExt's fields changed): every caller then
runs its Python version, which gives the same results.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

from sdk._crc import crc32, native_address
from sdk._wire import RecordFormatError, decode_properties
from sdk.message import Message, MessageExt, MessageQueue, SendResult

#: Set (to anything but "" or "0") to run without the C paths, as an install without a C
#: compiler does: to compare, or to rule them out when something looks wrong.
DISABLE_VARIABLE = "ORDERMQ_NO_SPEEDUPS"


def _load() -> ModuleType | None:
    if os.environ.get(DISABLE_VARIABLE, "") not in ("", "0"):
        return None
    try:
        from sdk import _speedups
    except ImportError:
        return None
    try:
        _speedups.configure(
            MessageExt, MessageQueue, RecordFormatError, crc32, decode_properties, native_address()
        )
        _speedups.configure_encode(Message)
        _speedups.configure_results(SendResult)
    except TypeError:
        return None
    return _speedups


#: The configured module, or None.
speedups = _load()


def _tracked_already(messages: list[MessageExt]) -> None:
    """Without the extension every message is decoded in Python, tracked: nothing to do."""


#: Gives messages decoded for a consumer's buffer (`codec.decode_records(...,
#: buffered=True)`, kept out of the cycle collector) back to the collector: called once the
#: consumer lets go of them (ProcessQueue; a poll's batch when the next one is handed out),
#: and by anything else that hands a pull's messages on, before it does.
hand_out: Callable[[list[MessageExt]], None] = (
    speedups.track if speedups is not None else _tracked_already
)
