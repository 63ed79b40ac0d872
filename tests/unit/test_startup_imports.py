"""What a broker or `ordermq` process loads at start.

Not the fronts and features it is not configured for: tests start hundreds of these
processes, and importing is most of what their start costs.
"""

from __future__ import annotations

import subprocess
import sys

#: Loaded only where they are built, when the configuration asks for them.
OPTIONAL = (
    "importlib.metadata",  # the version is a literal (sdk/_version.py)
    "mockbroker.acl",
    "yaml",
    "mockbroker.fronts.grpc.auth",
    "mockbroker.fronts.v2",
    "mockbroker._pb_v2",
    "mockbroker.fronts.remoting",
    "mockbroker.registrar",
    "mockbroker.fronts.console",
    "jinja2",
    "cryptography",
    "sdk._transport.remoting_transport",  # only for rocketmq:// endpoints
)


def loaded_at_start(module: str) -> set[str]:
    """The OPTIONAL modules a fresh interpreter has loaded after importing `module`."""
    code = f"import sys, {module}; print(*sorted(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    return {m for m in out if any(m == o or m.startswith(o + ".") for o in OPTIONAL)}


def test_the_broker_command_loads_no_front_or_feature_it_is_not_configured_for() -> None:
    assert loaded_at_start("mockbroker.__main__") == set()


def test_the_ordermq_command_loads_no_package_metadata() -> None:
    assert loaded_at_start("sdk.cli") == set()


def test_a_client_of_ordermq_brokers_loads_no_rocketmq_remoting() -> None:
    assert loaded_at_start("sdk") == set()
