"""The `/metrics` page, written on the broker's event loop a slice at a time.

prometheus_client writes the page in the thread that serves the request. With tens of
thousands of series (1 000 groups and their offsets) that is a thread running Python for
a quarter of a second, and it holds the GIL for a switch interval (5 ms) at a time
against the event loop, which gives the GIL up at every system call it makes (each
poll, read, write, send) and then waits for it again: the loop waited up to 10 ms for a
turn during such a scrape (bench/scrape_pauses.py). Written on the loop,
SAMPLES_PER_SLICE samples a turn, the page costs the loop its work in slices (as the
snapshot is taken), and the serving thread only waits for it (and compresses it: zlib
lets go of the GIL).

The page is what prometheus_client's encoder for the scraper's format (the text format,
or OpenMetrics) writes for the same families: each slice is written by it, and a family
cut into several slices has its header lines once.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable, Iterable
from urllib.parse import parse_qs
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from mockbroker.gc_hold import COLLECTIONS
from mockbroker.metrics import BrokerCollector

#: How long a scrape waits for the broker's event loop to make its page.
SNAPSHOT_TIMEOUT_SECONDS = 10.0

#: Samples written between two turns of the loop (prometheus_client writes a sample in
#: about 8 us on this project's machine: 2 ms a slice).
SAMPLES_PER_SLICE = 250

#: Writes the families a collector gives in one format (prometheus_client's
#: `generate_latest`, or OpenMetrics').
Encoder = Callable[[Collector], bytes]


class Families(Collector):
    """Given families, as a collector (what an encoder reads)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> list[Metric]:
        """The families given."""
        return self._families


async def written(
    families: Iterable[Metric], encoder: Encoder, names: frozenset[str] | None = None
) -> bytes:
    """The page of `families` in `encoder`'s format, giving the loop a turn between slices.

    `names`: only the samples of these names (the page's `name[]` parameters, as
    prometheus_client serves them); families left with none are left out. The families'
    samples are used up, each let go once written (freeing 35 000 of them at the end
    held the loop 8 ms).
    """
    trailer = encoder(Families([]))  # what ends a page: "# EOF" in OpenMetrics
    pieces: list[bytes] = []
    since_turn = 0
    for family in families:
        samples, family.samples = family.samples, []
        if names is not None:
            samples = [s for s in samples if s.name in names]
            if not samples:
                continue
        samples.reverse()  # taken from the end a slice at a time, and let go once written
        first = True
        while first or samples:
            part = Metric(family.name, family.documentation, family.type, family.unit)
            part.samples = samples[-SAMPLES_PER_SLICE:][::-1]
            del samples[-SAMPLES_PER_SLICE:]
            text = encoder(Families([part]))
            if trailer:
                text = text.removesuffix(trailer)
            pieces.append(text if first else _samples_only(text))
            first = False
            since_turn += len(part.samples)
            if since_turn >= SAMPLES_PER_SLICE:
                await asyncio.sleep(0)
                since_turn = 0
    pieces.append(trailer)
    return b"".join(pieces)


def _samples_only(text: bytes) -> bytes:
    """`text` without its leading comment lines (a family's HELP, TYPE and UNIT)."""
    while text.startswith(b"#"):
        text = text.partition(b"\n")[2]
    return text


class MetricsPage:
    """The `/metrics` page (WSGI): the collector's families in the format asked for.

    The scraper's Accept header chooses the text format or OpenMetrics, as
    prometheus_client chooses; `name[]` parameters keep only the samples of those names;
    the page is gzipped for a scraper that accepts it. Automatic garbage collections are
    held off while it is made (gc_hold.py).
    """

    def __init__(self, collector: BrokerCollector, loop: asyncio.AbstractEventLoop) -> None:
        self._collector = collector
        self._loop = loop

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """Answer one GET or HEAD of the page."""
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        params = parse_qs(environ.get("QUERY_STRING", ""))
        names = frozenset(params["name[]"]) if "name[]" in params else None
        with COLLECTIONS.held():  # the page's objects live until its text is made
            future = asyncio.run_coroutine_threadsafe(self._page(encoder, names), self._loop)
            try:
                body = future.result(timeout=SNAPSHOT_TIMEOUT_SECONDS)
            except TimeoutError:
                # Nobody reads it now: a loop too busy to make it in time is not given the
                # rest of its work, nor a pile of them as the scraper tries again.
                future.cancel()
                raise
        headers = [("Content-Type", content_type)]
        if _gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    async def _page(self, encoder: Encoder, names: frozenset[str] | None) -> bytes:
        return await written(await self._collector.families(), encoder, names)


def _gzip_accepted(accept_encoding: str) -> bool:
    return any(
        coding.split(";")[0].strip().lower() == "gzip" for coding in accept_encoding.split(",")
    )
