"""gRPC's socket code: ordermq chooses the older one where it was measured to cost less."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdk._grpc_io import LEGACY_IO, OPT_OUT, _grpcio_version, chosen_experiments

ROOT = Path(__file__).resolve().parents[2]


def test_the_legacy_socket_code_is_chosen_on_linux_with_the_measured_grpcio() -> None:
    assert chosen_experiments({}, "linux", "1.85.3", grpc_imported=False) == LEGACY_IO
    assert chosen_experiments({OPT_OUT: "0"}, "linux", "1.85.1", grpc_imported=False) == LEGACY_IO


@pytest.mark.parametrize(
    ("environ", "platform", "version", "imported"),
    [
        ({"GRPC_EXPERIMENTS": "-event_engine_dns"}, "linux", "1.85.3", False),  # the user's own
        ({OPT_OUT: "1"}, "linux", "1.85.3", False),  # opted out
        ({}, "darwin", "1.85.3", False),  # not measured there
        ({}, "linux", "1.86.0", False),  # may not know the experiments: it would log errors
        ({}, "linux", None, False),  # no grpcio distribution found
        ({}, "linux", "1.85.3", True),  # gRPC has read its settings already
    ],
)
def test_nothing_is_set_where_it_was_not_measured_or_the_user_chose(
    environ: dict[str, str], platform: str, version: str | None, imported: bool
) -> None:
    assert chosen_experiments(environ, platform, version, grpc_imported=imported) is None


def _experiments_after(code: str, **extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("GRPC_EXPERIMENTS", OPT_OUT)}
    env.update(extra, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code + "\nimport os; print(os.environ.get('GRPC_EXPERIMENTS'))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "Unknown experiment" not in done.stderr
    return done.stdout.strip()


def test_importing_sdk_or_mockbroker_first_sets_it_before_grpc_loads() -> None:
    expected = str(chosen_experiments({}, sys.platform, _grpcio_version(), grpc_imported=False))
    assert _experiments_after("import sdk") == expected
    assert _experiments_after("import mockbroker") == expected
    assert _experiments_after("import sdk", **{OPT_OUT: "1"}) == "None"
    assert _experiments_after("import grpc, sdk") == "None"  # too late to matter: left alone


def test_the_grpcio_version_is_read_from_its_file_as_its_metadata_says() -> None:
    import importlib.metadata

    assert _grpcio_version() == importlib.metadata.version("grpcio")
