"""Re-reading the ACL file when it changes, keeping the rules in force if it turns bad."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from mockbroker.acl.acl_file import AclFileError, load_acl_file
from mockbroker.acl.decisions import Acl
from sdk.clock import Clock, sleep_for

log = logging.getLogger(__name__)

DEFAULT_PERIOD = 5.0


class AclWatcher:
    """Polls an ACL file's mtime and size on the injected clock and reloads it into `acl`.

    RocketMQ watches its ACL files the same way (AclFileWatchService compares each file's
    modification time). A file that fails to read or check leaves the old rules in force
    and logs one line naming the file, the line and the fault (never a secret).
    """

    def __init__(
        self, acl: Acl, path: str | Path, clock: Clock, period: float = DEFAULT_PERIOD
    ) -> None:
        if period <= 0:
            raise ValueError(f"the ACL file's polling period must be positive, not {period}")
        self._acl = acl
        self._path = Path(path)
        self._clock = clock
        self._period = period
        self._seen = self._stamp()

    def poll(self) -> bool:
        """Reload if the file changed since the last look; True if new rules are in force."""
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        self._seen = stamp
        try:
            rules = load_acl_file(self._path)
        except AclFileError as e:
            log.warning("ACL file not reloaded, the old rules stay: %s", e)
            return False
        except OSError as e:
            log.warning("ACL file %s not reloaded, the old rules stay: %s", self._path, e.strerror)
            return False
        self._acl.replace(rules)
        log.info("ACL file %s reloaded: %d accounts", self._path, len(rules.accounts))
        return True

    async def run(self) -> None:
        """Poll every `period` seconds until cancelled."""
        while True:
            await sleep_for(self._clock, self._period)
            self.poll()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size
