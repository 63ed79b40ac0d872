"""--console: the broker's console open and refreshing while the figures run (issue 43).

Every broker the bench starts also serves its console (`--console-port 0`), and a thread
fetches its pages as a person watching would, every REFRESH_SECONDS: the overview, the
topics and every topic, the groups and every group (whose page samples its lag). Compare a
run with `--console` against one without: the console should cost the per-message path
nothing.
"""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from procs import ServerProcess

from tests.support import BrokerProcess

#: How often the watcher goes round the pages (the console's own refresh is 5 s; a person
#: clicking around is faster).
REFRESH_SECONDS = 1.0
CONSOLE_OPTIONS = ("--console-port", "0")
_LINKS = re.compile(r'href="(/(?:topics|groups)/[^"/]+)"')


def console_of(broker: ServerProcess) -> str:
    """The console address the broker announced."""
    assert broker.lines is not None, "not started"
    line = broker.lines.find(BrokerProcess.FRONTS["--console-port"][1], 30.0)
    if not line:
        raise RuntimeError(f"the broker announced no console: {broker.stderr()[-2000:]}")
    return line.split()[-1]


class Watcher:
    """Fetches a console's pages until stopped; counts them."""

    def __init__(self, address: str) -> None:
        self.base = f"http://{address}"
        self.pages = self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-watch", daemon=True)

    def _get(self, path: str) -> str:
        try:
            with urllib.request.urlopen(self.base + path, timeout=10) as response:
                self.pages += 1
                return str(response.read().decode())
        except (urllib.error.URLError, OSError):
            self.failures += 1
            return ""

    def _run(self) -> None:
        while True:
            self._get("/")
            for listing in ("/topics", "/groups"):
                for link in sorted(set(_LINKS.findall(self._get(listing)))):
                    self._get(link)
            if self._stop.wait(REFRESH_SECONDS):
                return

    @contextmanager
    def watching(self) -> Iterator[Watcher]:
        """Watch in a thread for the block."""
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(30)
