"""sdk._crc: the CRC-32 of records and frames, ISA-L's where installed, zlib's otherwise."""

from __future__ import annotations

import subprocess
import sys
import zlib

from hypothesis import given
from hypothesis import strategies as st

from sdk._crc import IMPLEMENTATION, crc32
from tests.support import ROOT


@given(st.binary(max_size=4096), st.integers(min_value=0, max_value=2**32 - 1))
def test_the_crc_is_zlibs_for_any_data_and_start_value(data: bytes, start: int) -> None:
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, start) == zlib.crc32(data, start)


@given(st.binary(min_size=8, max_size=600), st.data())
def test_the_crc_of_a_memoryview_slice_is_that_of_its_bytes(
    data: bytes, draw: st.DataObject
) -> None:
    start = draw.draw(st.integers(0, len(data)))
    end = draw.draw(st.integers(start, len(data)))
    assert crc32(memoryview(data)[start:end]) == zlib.crc32(data[start:end])


def test_isal_serves_where_it_is_installed() -> None:
    # a dependency of the package: a test run without it is not the one users get
    assert IMPLEMENTATION == "isal"


def test_without_isal_zlibs_crc_is_used() -> None:
    code = (
        "import sys; sys.modules['isal'] = None; sys.modules['isal.isal_zlib'] = None; "
        "import zlib, sdk._crc as c; print(c.IMPLEMENTATION, c.crc32 is zlib.crc32)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["zlib", "True"]
