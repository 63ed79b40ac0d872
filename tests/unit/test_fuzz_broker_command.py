"""The broker's command (`python -m mockbroker`) and the name server's, fuzzed option by option.

Every option of `build_parser()` (walked, so that a new one is fuzzed without being listed
here) is given what an operator could type by mistake: negative, zero and huge numbers,
numbers beyond 2^31 and 2^63, "nan" and "inf", text that is no number, empty text, paths
that are files, missing or unwritable, names with spaces or control characters. The command
line is parsed and its BrokerConfig built as `main()` does. A refused value ends it with
exit status 2 and one error line naming the option, and nothing is made on disk (the data
directory is not created). An accepted value must give a broker that starts and serves: a
few of each option's are started, on free ports, and sent to. The name server's command
(`python -m mockbroker.namesrv`) likewise, its server started and stopped in-process.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mockbroker.namesrv.__main__ as namesrv_command
from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.__main__ import build_parser, parse_args
from mockbroker.namesrv.server import NameServer
from sdk import Message, Producer
from tests.component.hostile_calls import bounded
from tests.fuzzing import fuzz_settings

NUMBERS = [
    "-1", "0", "1", "7", "2147483647", "2147483648", "9223372036854775807",
    "9223372036854775808", "-9223372036854775809", "99999999999999999999999", "1.5", "nan",
    "inf", "-inf", "1e309", "1e300", "1e-300", "x", "", " 1", "0x10", "1_000",
]  # fmt: skip
TEXT = [
    "", " ", "bad name", "a\x00b", "a\nb", "\t", "é", "a" * 300, "0.0.0.0", "::", "-", "*",
    "%RETRY%g", "h:1;h:x",
]  # fmt: skip
#: Options not fuzzed: --help and --version print and exit 0.
NOT_FUZZED = {"help", "version"}
PORTS = ("port", "v2_port", "remoting_port", "namesrv_port", "console_port", "exchange_port",
         "metrics_port")  # fmt: skip

numbers = st.sampled_from(NUMBERS) | st.integers().map(str) | st.floats().map(str)
texts = st.sampled_from(TEXT) | st.text(max_size=12)


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Paths an operator could give: a file, junk, a missing one, one under a read-only
    directory, a directory; and a port another socket listens on."""
    base = tmp_path_factory.mktemp("fuzz-broker-command")
    (base / "file").write_text("x")
    (base / "junk.pem").write_bytes(b"hello\xff\n")
    read_only = base / "read-only"
    read_only.mkdir()
    os.chmod(read_only, 0o500)
    return {
        "file": str(base / "file"),
        "junk": str(base / "junk.pem"),
        "missing": str(base / "missing" / "x"),
        "unwritable": str(read_only / "sub"),
        "directory": str(base),
        "empty": "",
    }


@pytest.fixture(scope="module")
def busy_port() -> Iterator[str]:
    """A port some other socket listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield str(s.getsockname()[1])


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's options that take a value (flags are tried on and off elsewhere)."""
    return [
        a for a in parser._actions if a.option_strings and a.dest not in NOT_FUZZED and a.nargs != 0
    ]


def values(action: argparse.Action, places: dict[str, str], busy: str) -> st.SearchStrategy[str]:
    """What an operator could type for `action`."""
    if action.choices:
        return st.sampled_from([*map(str, action.choices), "", "x", "Async", "json "])
    if action.type is Path:
        return st.sampled_from(sorted(places.values())) | texts
    if action.dest in PORTS or action.type in (int, float) or action.dest.endswith("_port"):
        return numbers | st.sampled_from([busy, "off"])
    return texts


def command_line(action: argparse.Action, value: str, data_dir: Path) -> list[str]:
    """The options to try `value` for `action`, with what it needs to be accepted at all."""
    argv = [] if action.dest == "data_dir" else ["--data-dir", str(data_dir)]
    if action.dest in ("namesrv_port", "namesrv_addr"):
        argv += ["--remoting-port", "0"]
    return [*argv, action.option_strings[0], value]


def parsed(argv: list[str]) -> tuple[BrokerConfig | None, int | None, str]:
    """The BrokerConfig `main()` would start with, or its exit status; and stderr."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse_args(argv), None, err.getvalue()
    except SystemExit as exc:
        return None, int(exc.code or 0), err.getvalue()


def check_refusal(action: argparse.Action, argv: list[str], code: int, stderr: str) -> None:
    """Exit status 2 and one error line, naming the option; argparse's usage may precede it."""
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1, (argv, code, stderr)
    names = (*action.option_strings, action.dest)
    assert any(name in errors[0] for name in names), f"{argv}: {errors[0]!r} names no option"
    assert "Traceback" not in stderr


def on_free_ports(config: BrokerConfig) -> BrokerConfig:
    """`config` with each port that is on moved to a free one (0)."""
    return dataclasses.replace(
        config, **{name: 0 for name in PORTS if getattr(config, name) is not None}
    )


def serves(config: BrokerConfig) -> None:
    """The broker starts from `config`, stores a send, and stops, within the bound."""

    def run() -> None:
        with EmbeddedBroker(config) as b, Producer(b.address) as producer:
            assert producer.send(Message("orders", b"x", sharding_key="k")).queue_offset >= 0

    bounded(run)


BROKER_OPTIONS = {a.dest: a for a in options(build_parser())}


def test_the_fuzz_walks_every_option() -> None:
    assert {"port", "data_dir", "keepalive_seconds", "tls_cert", "fifo_group"} <= set(
        BROKER_OPTIONS
    )
    assert len(BROKER_OPTIONS) > 40


@pytest.mark.parametrize("dest", sorted(BROKER_OPTIONS))
def test_a_hostile_value_is_refused_naming_the_option_or_accepted(
    dest: str, places: dict[str, str], busy_port: str, tmp_path: Path
) -> None:
    action = BROKER_OPTIONS[dest]
    data_dir = tmp_path / "data"

    @fuzz_settings(40, 400)
    @given(values(action, places, busy_port))
    def run(value: str) -> None:
        argv = command_line(action, value, data_dir)
        config, code, stderr = parsed(argv)
        if config is None:
            assert code is not None
            check_refusal(action, argv, code, stderr)
            assert not data_dir.exists(), f"{argv} made the data directory"

    run()


#: Accepted values at the edges of each numeric range, started for real.
EDGES = ["1", "1e-300", "2147483647", "2147483648", "9223372036854775808", "1e300"]


@pytest.mark.parametrize(
    "dest",
    sorted(d for d, a in BROKER_OPTIONS.items() if a.type in (int, float) and d not in PORTS),
)
def test_an_accepted_number_gives_a_broker_that_serves(dest: str, tmp_path: Path) -> None:
    action = BROKER_OPTIONS[dest]
    for value in EDGES:
        config, _, _ = parsed(command_line(action, value, tmp_path / value))
        if config is not None:
            serves(on_free_ports(config))


def test_a_keepalive_beyond_a_day_is_refused_naming_it(tmp_path: Path) -> None:
    # Past about 24 days gRPC's server options overflowed: a traceback at start, with
    # the data directory made.
    _, code, stderr = parsed(["--data-dir", str(tmp_path / "d"), "--keepalive-seconds", "1e300"])
    assert code == 2
    assert stderr.splitlines()[-1] == (
        "mockbroker: error: keepalive_seconds 1e+300 is outside (0, 86400] (a day)"
    )
    serves(BrokerConfig(data_dir=tmp_path / "d", keepalive_seconds=86_400))


def test_a_slice_of_a_million_messages_or_more_is_refused_naming_it(tmp_path: Path) -> None:
    # From 2^63 the broker started, then answered every send "Unexpected OverflowError".
    _, code, stderr = parsed(
        ["--data-dir", str(tmp_path / "d"), "--fair-slice-messages", str(2**63)]
    )
    assert (code, stderr.splitlines()[-1]) == (
        2,
        f"mockbroker: error: fair_slice_messages {2**63} is outside 1..1000000",
    )
    serves(BrokerConfig(data_dir=tmp_path / "d", fair_slice_messages=1_000_000))


def test_disk_checks_closer_than_10_ms_are_refused_naming_them(tmp_path: Path) -> None:
    # 1e-300 started a broker that checked the disk without pause and answered nothing.
    _, code, stderr = parsed(["--data-dir", str(tmp_path / "d"), "--disk-check-seconds", "1e-3"])
    assert (code, stderr.splitlines()[-1]) == (
        2,
        "mockbroker: error: disk_check_seconds 0.001 is below 0.01: disk checks that often "
        "leave the broker no time to serve",
    )
    serves(BrokerConfig(data_dir=tmp_path / "d", disk_check_seconds=0.01))


@pytest.mark.parametrize("empty", ["", " "])
def test_an_empty_data_directory_is_a_usage_error(empty: str) -> None:
    # Path("") is ".": the broker stored its files wherever the command ran.
    _, code, stderr = parsed(["--data-dir", empty])
    assert (code, stderr.splitlines()[-1]) == (
        2,
        f"mockbroker: error: argument --data-dir: {empty!r} names no directory",
    )


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--broker-name", "broker a", "broker_name 'broker a' must match"),
        ("--broker-name", "a\nb", "broker_name 'a\\nb' must match"),
        ("--broker-name", "", "broker_name '' must match"),
        ("--fifo-group", "pay ments", "fifo_groups names 'pay ments', which is no group name"),
        ("--fifo-group", "%RETRY%g", "fifo_groups names '%RETRY%g', which is no group name"),
    ],
)
def test_a_broker_name_or_fifo_group_no_client_could_use_is_a_usage_error(
    option: str, value: str, message: str
) -> None:
    # They were taken: a name server refused such a broker name at registration, and no
    # client can join a group of such a name, so the FIFO setting could never apply.
    _, code, stderr = parsed(["--data-dir", "unused", option, value])
    assert code == 2
    assert stderr.splitlines()[-1].startswith(f"mockbroker: error: {message}")


@pytest.mark.parametrize(
    "option", ["--host", "--advertised-host", "--metrics-host", "--console-host"]
)
@pytest.mark.parametrize("host", ["", "bad name", "a\x00b", "a\nb", "a" * 64, "a..b", "[::1"])
def test_a_host_that_is_no_host_name_is_a_usage_error_naming_it(option: str, host: str) -> None:
    # They were taken: the broker made its data directory, then failed to bind with a
    # traceback or an error line split by the name (a NUL, a line break, a label too long).
    field = option.removeprefix("--").replace("-", "_")
    _, code, stderr = parsed(["--data-dir", "unused", option, host])
    assert code == 2
    assert stderr.splitlines()[-1].startswith(
        f"mockbroker: error: {field} {host!r} is no host name or address: "
    )


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--client-timeout-seconds", "0", "client_timeout_seconds must be above 0, not 0.0"),
        ("--keepalive-seconds", "-1", "keepalive_seconds must be above 0, not -1.0"),
        ("--fair-slice-bytes", "0", "fair_slice_bytes must be above 0, not 0"),
        ("--segment-bytes", "5", "segment_bytes 5 must be at least 1048576 (1 MiB)"),
        ("--remoting-max-connections", "0", "remoting_max_connections must be above 0, not 0"),
        ("--retention-hours", "-1", "retention_hours must be above 0, not -1.0"),
        (
            "--disk-high-ratio",
            "0",
            "disk_high_ratio 0.0, disk_force_ratio 0.85 and disk_refuse_ratio 0.9 must "
            "satisfy 0 < high <= force <= refuse <= 1",
        ),
    ],
)
def test_a_refusal_names_the_option_and_its_value(
    option: str, value: str, message: str, tmp_path: Path
) -> None:
    # These said "flush intervals and timeouts must be positive", "disk ratios must
    # satisfy ..." and the like: no option named, or not the value given.
    _, code, stderr = parsed(["--data-dir", str(tmp_path / "d"), option, value])
    assert (code, stderr.splitlines()[-1]) == (2, f"mockbroker: error: {message}")


NAMESRV_OPTIONS = {a.dest: a for a in options(namesrv_command.build_parser())}


async def start_and_stop(host: str, port: int, scan_seconds: float) -> None:
    """What the name server's `serve` does, without waiting for a signal."""
    server = NameServer(scan_seconds=scan_seconds)
    await server.start(host, port)
    await server.stop()


def namesrv_main(argv: list[str]) -> tuple[int, str]:
    """`python -m mockbroker.namesrv ARGV`'s exit status and stderr; it serves not at all."""
    err = io.StringIO()
    original = namesrv_command.serve
    namesrv_command.serve = start_and_stop
    try:
        with contextlib.redirect_stderr(err):
            bounded(lambda: namesrv_command.main(argv))
        return 0, err.getvalue()
    except SystemExit as exc:
        return int(exc.code or 0), err.getvalue()
    finally:
        namesrv_command.serve = original


@pytest.mark.parametrize("dest", sorted(NAMESRV_OPTIONS))
def test_the_name_servers_command_refuses_a_hostile_value_or_serves(
    dest: str, places: dict[str, str], busy_port: str
) -> None:
    action = NAMESRV_OPTIONS[dest]

    @fuzz_settings(25, 300)
    @given(values(action, places, busy_port))
    def run(value: str) -> None:
        argv = [action.option_strings[0], value]
        if dest != "port":
            argv += ["--port", "0"]
        code, stderr = namesrv_main(argv)
        assert "Traceback" not in stderr and code in (0, 1, 2), (argv, code, stderr)
        if code == 1:
            assert len(stderr.strip().splitlines()) == 1, (argv, stderr)
        if code == 2:
            check_refusal(action, argv, code, stderr)

    run()


@pytest.mark.parametrize("port", ["70000", "-1", "2147483648"])
def test_the_name_servers_port_out_of_range_is_a_usage_error(port: str) -> None:
    # It reached bind(): "OverflowError: bind(): port must be 0-65535" and a traceback.
    code, stderr = namesrv_main(["--port", port])
    assert code == 2
    assert stderr.splitlines()[-1].endswith(f"argument --port: {int(port)} is outside 0..65535")


@pytest.mark.parametrize("host", ["a\x00b", "\ufff9", "a" * 64])
def test_the_name_servers_host_that_is_no_host_name_is_a_usage_error(host: str) -> None:
    # It reached getaddrinfo: a ValueError or UnicodeError traceback.
    code, stderr = namesrv_main(["--port", "0", "--host", host])
    assert code == 2
    assert stderr.splitlines()[-1].startswith(
        f"python -m mockbroker.namesrv: error: argument --host: {host!r}"
    )


def test_the_name_servers_scan_period_must_be_finite() -> None:
    code, stderr = namesrv_main(["--port", "0", "--scan-seconds", "nan"])
    assert code == 2
    assert stderr.splitlines()[-1].endswith(
        "--scan-seconds must be a finite number above 0, not nan"
    )
