"""tests/interop/provision.py: a client is installed once, a failure remembered for a while."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.interop import provision as p


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(p, "CACHE", tmp_path)
    return tmp_path


class Installer:
    """Counts its calls; fails with `error` when one is set."""

    def __init__(self, error: str = "") -> None:
        self.calls = 0
        self.error = error

    def __call__(self, log: Path) -> p.Client:
        self.calls += 1
        log.write_text("installing\n")
        if self.error:
            raise p.ProvisionError(self.error)
        return p.Client("fake", True, "", sys.executable, "driver.py", (("A", "1"),), (("v", "2"),))


def test_a_client_is_installed_once_and_then_found_by_its_stamp(cache: Path) -> None:
    install = Installer()
    first = p._provision("fake", False, False, install)
    again = p._provision("fake", False, False, install)
    assert install.calls == 1
    assert first.available and not first.cached
    assert again.cached and again.env == (("A", "1"),) and again.detail == (("v", "2"),)
    assert json.loads((cache / "fake.ready.json").read_text())["executable"] == sys.executable
    assert p._provision("fake", True, False, install).available  # force: installed again
    assert install.calls == 2


def test_a_stamp_whose_interpreter_is_gone_is_installed_again(cache: Path) -> None:
    install = Installer()
    p._provision("fake", False, False, install)
    stamp = cache / "fake.ready.json"
    record = json.loads(stamp.read_text())
    stamp.write_text(json.dumps({**record, "executable": str(cache / "gone" / "python")}))
    assert p._provision("fake", False, False, install).executable == sys.executable
    assert install.calls == 2


def test_a_stamp_from_another_checkout_runs_this_checkouts_driver(cache: Path) -> None:
    record = {"name": "python5", "available": True, "executable": sys.executable,
              "driver": "/elsewhere/tests/interop/rmq5_driver.py",
              "requirement": p.ROCKETMQ5_PYPI}  # fmt: skip
    (cache / "python5.ready.json").write_text(json.dumps(record))
    client = p._provision("python5", False, False, Installer())
    assert client.cached and client.driver == str(p.PYTHON5_DRIVER)


def test_a_stamp_made_for_another_version_of_the_client_is_installed_again(cache: Path) -> None:
    older = "rocketmq-python-client==5.0.0"
    record = {"name": "python5", "available": True, "executable": sys.executable,
              "driver": str(p.PYTHON5_DRIVER), "requirement": older}  # fmt: skip
    (cache / "python5.ready.json").write_text(json.dumps(record))
    install = Installer()
    assert not p._provision("python5", False, False, install).cached
    assert install.calls == 1


def test_the_clients_are_cached_once_per_user_not_per_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert p._default_cache() == tmp_path / "xdg" / "ordermq" / "interop"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert p._default_cache() == tmp_path / "home" / ".cache" / "ordermq" / "interop"
    assert not p._default_cache().is_relative_to(p.ROOT)


def test_a_failure_is_remembered_until_its_ttl_or_a_retry(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = Installer("pip install rocketmq==0.4.4 failed (exit 1): no network")
    first = p._provision("fake", False, False, broken)
    assert not first.available
    assert first.reason.startswith("pip install rocketmq==0.4.4 failed (exit 1): no network")
    assert str(cache / "fake.log") in first.reason
    again = p._provision("fake", False, False, broken)
    assert broken.calls == 1 and "recorded" in again.reason and "no network" in again.reason

    fixed = Installer()
    assert p._provision("fake", False, True, fixed).available  # make interop-setup retries
    assert not (cache / "fake.failed.json").exists()

    stale = Installer("still broken")
    p._provision("other", False, False, stale)
    monkeypatch.setattr(p, "FAILURE_TTL", 0.0)  # the failure is older than the TTL
    p._provision("other", False, False, stale)
    assert stale.calls == 2


def test_a_failure_replaces_an_older_stamp(cache: Path) -> None:
    p._provision("fake", False, False, Installer())
    failed = p._provision("fake", True, False, Installer("broken now"))
    assert not failed.available
    assert not (cache / "fake.ready.json").exists()
    record = json.loads((cache / "fake.failed.json").read_text())
    assert record["reason"].startswith("broken now") and record["at"] <= time.time()


def test_the_cpp_client_is_refused_at_once_off_linux_x86_64(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(p.platform, "machine", lambda: "aarch64")
    with pytest.raises(p.ProvisionError, match=r"manylinux1 x86_64 only; this is .* aarch64"):
        p._install_cpp(cache / "cpp.log")
    assert not (cache / "cpp-venv").exists()


def test_the_node_client_needs_node_on_the_path(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(cache))  # no node, no npm
    with pytest.raises(p.ProvisionError, match=r"Node\.js is not installed here"):
        p._install_node(cache / "node.log")


def test_a_failed_step_names_its_error_lines(cache: Path) -> None:
    script = "import sys; print('ok'); print('ERROR: no matching distribution', file=sys.stderr)"
    with pytest.raises(p.ProvisionError) as raised:
        p._run([sys.executable, "-c", script + "; sys.exit(1)"], cache / "x.log", "the step")
    assert str(raised.value) == "the step failed (exit 1): ERROR: no matching distribution"
    assert "ERROR: no matching distribution" in (cache / "x.log").read_text()
