"""Install other people's RocketMQ clients once, into a git-ignored cache, never into .venv.

- `cpp`: PyPI `rocketmq` 0.4.4, a ctypes wrapper whose manylinux1 x86-64 wheel bundles
  Apache rocketmq-client-cpp 1.2.3 (`librocketmq.so`), in a virtualenv of its own;
- `node`: npm `ali-ons` 3.12.0, a RocketMQ remoting client in plain JavaScript, in a
  node_modules of its own, when Node.js and npm are on PATH;
- `python5`: PyPI `rocketmq-python-client` 5.1.2, Apache RocketMQ's Python client of
  RocketMQ 5's gRPC API, in a virtualenv of its own (it registers RocketMQ 5's protos
  under the names mockbroker/_pb_v2 uses: it can never share a process with ordermq);
- `node5`: npm `rocketmq-client-nodejs` 1.0.8, Apache RocketMQ's Node.js client of the
  same API, in a node_modules of its own.

They go to a per-user cache, `~/.cache/ordermq/interop/` (under `$XDG_CACHE_HOME` when set;
ORDERMQ_INTEROP_CACHE overrides it), so every checkout on a machine shares one install:
a fresh clone's `make test` does not install them again. A stamp names the package
version it was made for; another version installs afresh. Provisioning is
idempotent (a stamp file is written last, after the client passed its self-check: the
driver imports the client and starts and stops it), and safe when several processes race
(an exclusive file lock per client). A failure is remembered for FAILURE_TTL seconds, so a
machine without network does not pay pip's time-outs in every test module; `--force`
retries at once. Used by the interop tests (`require`) and by `make interop-setup`:

    python -m tests.interop.provision [cpp] [node] [python5] [node5] [--force]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _default_cache() -> Path:
    """The per-user cache of the clients: $XDG_CACHE_HOME/ordermq/interop or ~/.cache/..."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ordermq" / "interop"


CACHE = Path(os.environ.get("ORDERMQ_INTEROP_CACHE") or _default_cache())
CPP_DRIVER = HERE / "cpp_driver.py"
NODE_DRIVER = HERE / "ons_driver.js"
PYTHON5_DRIVER = HERE / "rmq5_driver.py"
NODE5_DRIVER = HERE / "rmq5_driver.js"

ROCKETMQ_PYPI = "rocketmq==0.4.4"
ALI_ONS_NPM = "ali-ons@3.12.0"
#: The newest release (the notes on the v2 API were made with it too).
ROCKETMQ5_PYPI = "rocketmq-python-client==5.1.2"
ROCKETMQ5_NPM = "rocketmq-client-nodejs@1.0.8"
#: Node.js versions ali-ons 3.12 runs on (package.json: ">= 8.0.0"; async/await needs 8).
NODE_MIN_MAJOR = 8
#: rocketmq-client-nodejs's README: Node.js 16.19 at least.
NODE5_MIN_MAJOR = 16
#: A recorded failure is reused for this long (seconds) before provisioning is tried again.
FAILURE_TTL = float(os.environ.get("ORDERMQ_INTEROP_FAILURE_TTL", "600"))
#: Bounds on the installers, so that a machine without network gives up in tens of seconds.
PIP_FLAGS = (
    "--disable-pip-version-check", "--no-input", "--only-binary", ":all:",
    "--timeout", "20", "--retries", "1",
)  # fmt: skip
NPM_FLAGS = (
    "--no-audit", "--no-fund", "--loglevel=error", "--fetch-timeout=20000", "--fetch-retries=1",
)  # fmt: skip
STEP_TIMEOUT = 300.0
#: When set (to anything but 0), a client that cannot be provisioned fails the tests that
#: need it instead of skipping them: for a CI that is known to reach PyPI and npm.
REQUIRED_ENV = "ORDERMQ_INTEROP_REQUIRED"


@dataclass(frozen=True)
class Client:
    """A provisioned client, or why it is not available."""

    name: str
    available: bool
    reason: str = ""
    #: The interpreter that runs the driver: the venv's python, or node.
    executable: str = ""
    #: The driver program (tests/interop/cpp_driver.py or ons_driver.js).
    driver: str = ""
    #: Extra environment for the driver (NODE_PATH for ali-ons).
    env: tuple[tuple[str, str], ...] = ()
    #: What the self-check reported (client and runtime versions).
    detail: tuple[tuple[str, str], ...] = ()
    #: How long the installation took.
    seconds: float = 0.0
    #: True when an earlier run installed it (this one found its stamp).
    cached: bool = False
    #: The package it was installed from (a stamp of another one is not reused).
    requirement: str = ""

    def command(self, *args: str) -> list[str]:
        """The command line that runs the driver with `args`."""
        return [self.executable, self.driver, *args]

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default os.environ) plus what the driver needs."""
        return {**(os.environ if base is None else base), **dict(self.env)}


class ProvisionError(Exception):
    """A step of provisioning failed; the message says which and why."""


# ---------------------------------------------------------------------------- plumbing
@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if needed) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _run(cmd: list[str], log: Path, what: str, **kwargs: object) -> str:
    """Run a provisioning step, appending its output to `log`; its stdout, or ProvisionError."""
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=STEP_TIMEOUT, check=False, **kwargs
        )  # type: ignore[call-overload]
    except subprocess.TimeoutExpired:
        raise ProvisionError(f"{what} did not finish within {STEP_TIMEOUT:g} s") from None
    except OSError as exc:
        raise ProvisionError(f"{what} could not run: {exc}") from None
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}(exit {proc.returncode})\n")
    if proc.returncode != 0:
        raise ProvisionError(f"{what} failed (exit {proc.returncode}): {_gist(proc)}")
    return str(proc.stdout)


def _gist(proc: subprocess.CompletedProcess[str]) -> str:
    """The error lines of a failed step (pip's last ones, npm's first ones), joined."""
    lines = [line.strip() for line in (proc.stderr + proc.stdout).splitlines()]
    errors = [line for line in lines if "error" in line.lower() and line.lower() != "npm error"]
    picked = errors[-2:] if any(line.startswith("ERROR:") for line in errors) else errors[:4]
    return " | ".join(picked or lines[-3:])


def _self_check(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """Run the driver's `selfcheck`; the facts it printed (one JSON line)."""
    out = _run(cmd, log, "the driver's self-check", env=env)
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict) and event.get("event") == "selfcheck":
                return {k: str(v) for k, v in event.items() if k != "event"}
    raise ProvisionError(f"the driver's self-check printed no selfcheck line: {out[-300:]!r}")


def _cached(name: str, retry_failed: bool) -> Client | None:
    """The client recorded by an earlier run: ready (stamp), or failed recently."""
    stamp, failed = CACHE / f"{name}.ready.json", CACHE / f"{name}.failed.json"
    if stamp.exists():
        # The driver is this checkout's (a cache shared through ORDERMQ_INTEROP_CACHE may
        # have been filled by another checkout, whose driver can differ).
        driver = {"cpp": CPP_DRIVER, "node": NODE_DRIVER, "python5": PYTHON5_DRIVER,
                  "node5": NODE5_DRIVER}.get(name)  # fmt: skip
        record = _tuples(json.loads(stamp.read_text()))
        if record.get("requirement", "") != REQUIREMENTS.get(name, ""):
            return None  # made for another version of the client: install afresh
        if driver is not None:
            record["driver"] = str(driver)
        client = Client(**{**record, "cached": True})
        if Path(client.executable).exists():
            return client
    if failed.exists() and not retry_failed:
        record = json.loads(failed.read_text())
        if time.time() - float(record["at"]) < FAILURE_TTL:
            return Client(name, False, f"{record['reason']} (recorded {failed}; retried after "
                          f"{FAILURE_TTL:g} s or with make interop-setup)")  # fmt: skip
    return None


def _tuples(record: dict[str, object]) -> dict[str, object]:
    """A JSON record of a Client with its pair lists as tuples again."""
    for key in ("env", "detail"):
        record[key] = tuple(tuple(pair) for pair in record.get(key, ()))  # type: ignore[attr-defined]
    return record


def _record(client: Client) -> Client:
    """Write the stamp (or the failure) of a provisioning attempt; return `client`."""
    stamp, failed = CACHE / f"{client.name}.ready.json", CACHE / f"{client.name}.failed.json"
    if client.available:
        failed.unlink(missing_ok=True)
        stamp.write_text(json.dumps(asdict(client), indent=2) + "\n")
    else:
        stamp.unlink(missing_ok=True)
        failed.write_text(json.dumps({"reason": client.reason, "at": time.time()}) + "\n")
    return client


def _provision(
    name: str, force: bool, retry_failed: bool, install: Callable[[Path], Client]
) -> Client:
    """Install `name` with `install` under its lock, unless it is cached (or failed lately)."""
    with _locked(CACHE / f"{name}.lock"):
        if force:
            (CACHE / f"{name}.ready.json").unlink(missing_ok=True)
        cached = _cached(name, force or retry_failed)
        if cached is not None:
            return cached
        started = time.monotonic()
        log = CACHE / f"{name}.log"
        log.write_text("")
        try:
            client = install(log)
        except ProvisionError as exc:
            return _record(Client(name, False, f"{exc} (log: {log})"))
        return _record(
            Client(**{**asdict(client), "seconds": round(time.monotonic() - started, 1)})
        )


# ---------------------------------------------------------------------------- the clients
def _venv_client(name: str, requirement: str, driver: Path, log: Path) -> Client:
    """`requirement` in a new virtualenv `<name>-venv`, checked by `driver selfcheck`."""
    venv = CACHE / f"{name}-venv"
    shutil.rmtree(venv, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(venv)], log, "creating the virtualenv")
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", *PIP_FLAGS, requirement], log,
         f"pip install {requirement}")  # fmt: skip
    home = CACHE / f"{name}-home"  # the clients log under $HOME/logs
    home.mkdir(exist_ok=True)
    detail = _self_check(
        [str(python), str(driver), "selfcheck"], log, env={**os.environ, "HOME": str(home)}
    )
    return Client(
        name, True, "", str(python), str(driver), (), tuple(detail.items()), requirement=requirement
    )


def _install_cpp(log: Path) -> Client:
    if sys.platform != "linux" or platform.machine() != "x86_64":
        raise ProvisionError(
            f"the {ROCKETMQ_PYPI} wheel is manylinux1 x86_64 only; this is "
            f"{sys.platform} {platform.machine()}"
        )
    return _venv_client("cpp", ROCKETMQ_PYPI, CPP_DRIVER, log)


def _install_python5(log: Path) -> Client:
    return _venv_client("python5", ROCKETMQ5_PYPI, PYTHON5_DRIVER, log)


def _node_major(node: str) -> int:
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    try:
        return int(out.strip().lstrip("v").split(".")[0])
    except ValueError:
        return 0


def _npm_client(name: str, package: str, min_major: int, driver: Path, log: Path) -> Client:
    """npm `package` in a node_modules of its own (CACHE/<name>), checked by its driver."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise ProvisionError("Node.js is not installed here (node and npm must be on PATH)")
    if (major := _node_major(node)) < min_major:
        raise ProvisionError(
            f"{package.split('@')[0]} needs Node.js {min_major} or newer; this is {major}"
        )
    prefix = CACHE / name
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    (prefix / "package.json").write_text('{"private": true, "name": "ordermq-interop"}\n')
    _run([npm, "install", *NPM_FLAGS, package], log, f"npm install {package}", cwd=prefix)
    env = (("NODE_PATH", str(prefix / "node_modules")),)
    home = CACHE / f"{name}-home"  # rocketmq-client-nodejs logs under $HOME/logs
    home.mkdir(exist_ok=True)
    detail = _self_check(
        [node, str(driver), "selfcheck"], log, {**os.environ, **dict(env), "HOME": str(home)}
    )
    return Client(
        name, True, "", node, str(driver), env, tuple(detail.items()), requirement=package
    )


def _install_node(log: Path) -> Client:
    return _npm_client("node", ALI_ONS_NPM, NODE_MIN_MAJOR, NODE_DRIVER, log)


def _install_node5(log: Path) -> Client:
    return _npm_client("node5", ROCKETMQ5_NPM, NODE5_MIN_MAJOR, NODE5_DRIVER, log)


_INSTALLERS = {
    "cpp": _install_cpp,
    "node": _install_node,
    "python5": _install_python5,
    "node5": _install_node5,
}
#: What each client is installed from; a stamp that names another is installed again.
REQUIREMENTS = {
    "cpp": ROCKETMQ_PYPI,
    "node": ALI_ONS_NPM,
    "python5": ROCKETMQ5_PYPI,
    "node5": ROCKETMQ5_NPM,
}
_SESSION: dict[str, Client] = {}


def provision(name: str, *, force: bool = False, retry_failed: bool = False) -> Client:
    """The client `name` (of _INSTALLERS), installed if it is not yet; once per process.

    `force` reinstalls it; `retry_failed` tries again even if it failed lately.
    """
    if force or retry_failed or name not in _SESSION:
        _SESSION[name] = _provision(name, force, retry_failed, _INSTALLERS[name])
    return _SESSION[name]


def require(name: str) -> Client:
    """The client, or skip the calling test with the reason it is unavailable.

    With ORDERMQ_INTEROP_REQUIRED set, an unavailable client fails the test instead.
    """
    import pytest

    client = provision(name)
    if not client.available:
        message = f"{name} client unavailable: {client.reason}"
        if os.environ.get(REQUIRED_ENV, "0") not in ("", "0"):
            pytest.fail(message)
        pytest.skip(message)
    return client


def main(argv: list[str] | None = None) -> int:
    """`make interop-setup`: provision the clients and say how it went; 1 if one failed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("clients", nargs="*", help=f"of {', '.join(_INSTALLERS)} (default: all)")
    p.add_argument("--force", action="store_true", help="reinstall even if cached")
    a = p.parse_args(argv)
    if unknown := set(a.clients) - set(_INSTALLERS):
        p.error(f"unknown clients {sorted(unknown)}; choose of {', '.join(_INSTALLERS)}")
    failed = 0
    for name in a.clients or list(_INSTALLERS):
        client = provision(name, force=a.force, retry_failed=True)
        if client.available:
            how = f"{'cached, ' if client.cached else ''}installed in {client.seconds:g} s"
            facts = ", ".join(f"{k} {v}" for k, v in client.detail)
            print(f"{name}: ready ({how}): {facts}; {client.executable} {client.driver}")
        else:
            failed += 1
            print(f"{name}: unavailable: {client.reason}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
