"""gRPC's socket code for ordermq's processes: the one that costs least per request.

gRPC 1.85 runs channels' and servers' sockets on its EventEngine by default; its older
code path (iomgr's epoll poller) is still there, chosen by the experiments below. On
Linux the older path costs both sides less per request (with the EventEngine, part of
each read and write runs on gRPC's own threads): docs/performance.md has the figures.

gRPC reads GRPC_EXPERIMENTS once, when `grpc` is first imported, so this module sets it
when `sdk` is imported first (mockbroker imports `sdk`), and only where it was measured:
on Linux, with grpcio 1.85 (another release may not know these experiments and would log
an error about them at every start). A GRPC_EXPERIMENTS of the user's own is left as it
is; ORDERMQ_GRPC_EVENT_ENGINE=1 keeps gRPC's default. Child processes inherit the
setting, as they inherit the rest of the environment.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Mapping

#: The experiments that turn the EventEngine off for client channels and for servers.
LEGACY_IO = "-event_engine_client,-event_engine_listener"
#: grpcio releases (major.minor) whose EventEngine this choice was measured against.
MEASURED_RELEASES = frozenset({"1.85"})
#: Set (to anything but "" or "0") to keep gRPC's default socket code.
OPT_OUT = "ORDERMQ_GRPC_EVENT_ENGINE"


def chosen_experiments(
    environ: Mapping[str, str], platform: str, grpcio_version: str | None, grpc_imported: bool
) -> str | None:
    """The GRPC_EXPERIMENTS value to set, or None to leave the environment alone."""
    if platform != "linux" or grpc_imported or grpcio_version is None:
        return None
    if "GRPC_EXPERIMENTS" in environ or environ.get(OPT_OUT, "") not in ("", "0"):
        return None
    if ".".join(grpcio_version.split(".")[:2]) not in MEASURED_RELEASES:
        return None
    return LEGACY_IO


def _grpcio_version() -> str | None:
    """The installed grpcio's version, read from its file without importing grpc.

    (importlib.metadata would cost every process's start more than this whole module.)
    """
    spec = importlib.util.find_spec("grpc")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        try:
            with open(os.path.join(folder, "_grpcio_metadata.py"), encoding="utf-8") as f:
                found = re.search(r"[0-9]+\.[0-9]+[0-9.]*", f.read())
        except OSError:
            continue
        return found.group(0) if found else None
    return None


def choose() -> None:
    """Set GRPC_EXPERIMENTS for this process before gRPC starts, where it pays (above)."""
    experiments = chosen_experiments(
        os.environ, sys.platform, _grpcio_version(), "grpc" in sys.modules
    )
    if experiments is not None:
        os.environ["GRPC_EXPERIMENTS"] = experiments


choose()
