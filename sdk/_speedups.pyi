"""Types of sdk._speedups (sdk/_speedups.c): decode_records in C."""

from collections.abc import Callable
from typing import Any

def configure(
    message_type: type,
    queue_type: Callable[[str, str, int], Any],
    format_error: type[Exception],
    crc32: Callable[[memoryview], int],
    decode_properties: Callable[[bytes], dict[str, str]],
) -> None: ...
def decode_records(records: bytes, broker_name: str) -> list[Any]: ...
