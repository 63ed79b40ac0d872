"""deploy/: the systemd unit and the container image start a broker that serves.

Both carry the broker's command line (docs/production.md shows them): each is run here
with its own options (ports, data directory and listening address swapped for the
test's), and its health check's URL is asked of a broker with metrics on. The unit is
also checked by `systemd-analyze verify`, and the image built, where those exist.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk._transport.broker_client import BrokerClient
from tests.support import ROOT
from tests.system.conftest import StartBroker

pytestmark = pytest.mark.system

UNIT = ROOT / "deploy" / "ordermq-broker.service"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
#: Options whose values are the machine's, not the test's: swapped or dropped here.
OWN_VALUES = {"--host", "--port", "--data-dir", "--metrics-port"}


def logical_lines(path: Path) -> list[str]:
    """The file's lines with `\\` continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", path.read_text())
    return [line for line in joined.splitlines() if line and not line.startswith("#")]


def unit_setting(name: str) -> str:
    (value,) = [
        line.split("=", 1)[1] for line in logical_lines(UNIT) if line.startswith(name + "=")
    ]
    return value


def unit_command() -> list[str]:
    return shlex.split(unit_setting("ExecStart").replace("%H", socket.gethostname()))


def image_command() -> list[str]:
    """ENTRYPOINT followed by CMD, as `docker run IMAGE` runs them."""
    found: dict[str, list[str]] = {}
    for line in logical_lines(DOCKERFILE):
        instruction, _, rest = line.partition(" ")
        if instruction in ("ENTRYPOINT", "CMD"):
            found[instruction] = json.loads(rest)
    return found["ENTRYPOINT"] + found["CMD"]


def options(command: list[str]) -> dict[str, str]:
    """--option value pairs of a broker command line (flags map to "")."""
    out: dict[str, str] = {}
    args = command[1:]
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[i + 1] if i + 1 < len(args) else "--"
            out[arg] = "" if following.startswith("--") else following
    return out


def test_the_commands_are_the_broker_s_with_their_health_checks_on_its_metrics_port() -> None:
    unit, image = unit_command(), image_command()
    assert unit[0].endswith("/mockbroker") and image[0] == "mockbroker"
    readiness = [unit_setting("ExecStartPost"), *logical_lines(DOCKERFILE)]
    for command, checks in ((unit, readiness[:1]), (image, readiness[1:])):
        urls = [u for c in checks for u in re.findall(r"http://[\w.:]+/\w+", c)]
        assert urls, f"no health check URL for {command[0]}"
        for url in urls:
            assert urlsplit(url).port == int(options(command)["--metrics-port"]), url


@pytest.mark.parametrize("command", [unit_command(), image_command()], ids=["unit", "image"])
def test_the_command_serves_and_stops_cleanly_on_sigterm(
    command: list[str], start_broker: StartBroker, tmp_path: Path
) -> None:
    extra: list[str] = ["--metrics-port", "0"]
    for option, value in options(command).items():
        if option not in OWN_VALUES:
            extra += [option, value] if value else [option]
    broker = start_broker(tmp_path / "data", *extra)

    async def status() -> None:  # answered: the broker's SIGTERM handler is in place
        client = BrokerClient(broker.address)
        try:
            await client.broker_status()
        finally:
            await client.close()

    asyncio.run(status())
    assert broker.terminate() == 0, broker.stderr()
    assert "unclean" not in broker.stderr()


def test_the_health_check_urls_answer_as_health_checks(tmp_path: Path) -> None:
    paths = {
        urlsplit(u).path
        for text in (UNIT.read_text(), DOCKERFILE.read_text())
        for u in re.findall(r"http://[\w.:]+/\w+", text)
    }
    assert paths == {"/readyz"}
    config = BrokerConfig(data_dir=tmp_path / "data", metrics_port=0)
    with EmbeddedBroker(config) as broker:
        for path in ("/healthz", "/readyz"):
            url = f"http://127.0.0.1:{broker.broker.metrics_port}{path}"
            with urllib.request.urlopen(url, timeout=10) as answer:
                body = answer.read().decode()
            assert answer.status == 200
            assert "# HELP" not in body, f"{path} answers with the metrics page"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    # verify checks that the commands exist: point it at this machine's mockbroker.
    unit = tmp_path / UNIT.name
    mockbroker = str(Path(sys.executable).parent / "mockbroker")
    unit.write_text(UNIT.read_text().replace(unit_command()[0], mockbroker))
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr


def docker_engine() -> bool:
    if shutil.which("docker") is None:
        return False
    proc = subprocess.run(["docker", "info"], capture_output=True, timeout=60)
    return proc.returncode == 0


@pytest.mark.skipif(not docker_engine(), reason="no Docker engine here (only the client, if any)")
def test_the_image_builds_and_its_broker_runs() -> None:
    tag = "ordermq-broker:test"
    build = subprocess.run(
        ["docker", "build", "-f", str(DOCKERFILE), "-t", tag, str(ROOT)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    run = subprocess.run(
        ["docker", "run", "--rm", tag, "--help"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and "--data-dir" in run.stdout, run.stdout + run.stderr
