"""Types of sdk._speedups (sdk/_speedups.c): decode_records in C."""

from collections.abc import Callable, Sequence
from typing import Any

def configure(
    message_type: type,
    queue_type: Callable[[str, str, int], Any],
    format_error: type[Exception],
    crc32: Callable[[memoryview], int],
    decode_properties: Callable[[bytes], dict[str, str]],
    native_crc: int | None = None,
) -> bool: ...
def decode_records(records: bytes, broker_name: str, tracked: bool = True) -> list[Any]: ...
def scan_frames(
    frames: bytes | memoryview,
    start: int,
    first_index: int,
    last_index: int,
    stop_at: int,
    max_body: int,
    max_properties: int,
    half_key: str,
    half_allowed: bool,
) -> list[int] | None: ...
def scan_parts(
    parts: list[bytes],
    max_frames: int,
    max_bytes: int,
    max_body: int,
    max_properties: int,
    half_key: str,
    half_allowed: bool,
) -> list[list[int]] | None: ...
def lay_out_parts(
    parts: list[tuple[bytes, list[int], int, int]],
    into: list[Any],
    topic: bytes,
    store_timestamp_ms: int,
    base_position: int,
    reconsume_times: int,
    positions: list[int] | None,
    ids: list[bytes] | None,
    keyed: list[tuple[int, bytes]] | None,
) -> list[bytes]: ...
def configure_encode(message_type: type) -> None: ...
def encode_frames(
    messages: Sequence[Any],
    ids: Sequence[bytes],
    born_ms: int,
    now_s: float,
    fallback: Callable[[Any, bytes, float], bytes],
) -> list[bytes]: ...
def shard_groups(
    messages: Sequence[Any], topic: str, queue_count: int
) -> dict[int, list[int]] | None: ...
def shard_hash(data: bytes) -> int: ...
def pick(items: list[Any], indexes: list[int]) -> list[Any]: ...
def put_at(into: list[Any], indexes: list[int], values: list[Any]) -> None: ...
def message_ids(prefix: bytes, numbers: list[int]) -> list[bytes]: ...
def pack_id_entries(ids: list[bytes], positions: list[int]) -> bytes: ...
def rebase_entries(entries: bytes, delta: int) -> bytes | None: ...
def shifted(positions: list[int], delta: int) -> list[int] | None: ...
def configure_results(result_type: type) -> None: ...
def send_results(
    status: Any, ids: Sequence[bytes], queue: Any, first_offset: int, step: int
) -> list[Any]: ...
def track(messages: list[Any]) -> None: ...
