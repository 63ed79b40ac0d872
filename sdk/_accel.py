"""sdk._speedups (sdk/_speedups.c), configured once, or None.

Messages encoded, records decoded, frames checked and records laid out in C. None where
it was not built (no C compiler at install) or does not fit this code (Message's or
MessageExt's fields changed): every caller then runs its Python version, which gives the
same results.
"""

from __future__ import annotations

from types import ModuleType

from sdk._crc import crc32, native_address
from sdk._wire import RecordFormatError, decode_properties
from sdk.message import Message, MessageExt, MessageQueue


def _load() -> ModuleType | None:
    try:
        from sdk import _speedups
    except ImportError:
        return None
    try:
        _speedups.configure(
            MessageExt, MessageQueue, RecordFormatError, crc32, decode_properties, native_address()
        )
        _speedups.configure_encode(Message)
    except TypeError:
        return None
    return _speedups


#: The configured module, or None.
speedups = _load()
