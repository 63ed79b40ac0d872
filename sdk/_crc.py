"""CRC-32 (zlib's polynomial) for the records' and frames' checksums, as fast as installed.

Every record ordermq stores or delivers carries a CRC-32 that the broker computes when it
lays records out and checks when it reads them, and that the client checks when it
decodes them: three calls per message on small inputs (150-300 bytes), where zlib 1.2's
table-driven loop costs about 145 ns and ISA-L's folding code about 25 ns (python-isal,
2026-11-28, this machine). The values are the same (the same polynomial and
conditioning), so records written with one are checked with the other.

Without python-isal for this platform (it ships wheels for x86-64 and aarch64 Linux,
macOS and Windows), zlib's is used.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

#: crc32(data, value=0) -> int, as zlib.crc32.
crc32: Callable[..., int]
#: Which implementation `crc32` is ("isal" or "zlib"), for the benchmarks' reports.
IMPLEMENTATION: str
try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - a platform without python-isal's wheel
    crc32, IMPLEMENTATION = zlib.crc32, "zlib"
else:
    IMPLEMENTATION = "isal"


def native_address() -> int | None:
    """The C entry of `crc32` (ISA-L's crc32_gzip_refl), for sdk._speedups to call directly.

    None with zlib's, or where the library does not export it; sdk._speedups checks it
    against `crc32` before it uses it.
    """
    if IMPLEMENTATION != "isal":
        return None
    import ctypes

    from isal import isal_zlib

    try:
        entry = ctypes.CDLL(isal_zlib.__file__).crc32_gzip_refl
    except (OSError, AttributeError):
        return None
    return ctypes.cast(entry, ctypes.c_void_p).value
