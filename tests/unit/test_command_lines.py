"""The two commands' options: every one explained, one default port, and --version."""

from __future__ import annotations

import importlib.metadata

import click
import pytest
from click.testing import CliRunner

import sdk
from mockbroker import BrokerConfig
from mockbroker.__main__ import build_parser
from sdk.cli import DEFAULT_BROKER, _bytes, _duration, _rate, cli


def click_commands(group: click.Group, path: str = "ordermq") -> list[tuple[str, click.Command]]:
    """Every command under `group`, with its full name, the group included."""
    found: list[tuple[str, click.Command]] = [(path, group)]
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += click_commands(command, f"{path} {name}")
        else:
            found.append((f"{path} {name}", command))
    return found


def test_every_broker_option_has_help() -> None:
    missing = [
        action.option_strings[0]
        for action in build_parser()._actions
        if action.option_strings and not (action.help and action.help.strip())
    ]
    assert missing == []


def test_every_ordermq_option_has_help() -> None:
    missing = [
        f"{name} {param.opts[0]}"
        for name, command in click_commands(cli)
        for param in command.params
        if isinstance(param, click.Option) and not (param.help and param.help.strip())
    ]
    assert missing == []


def test_the_broker_command_listens_where_ordermq_looks_and_embedding_picks_a_free_port() -> None:
    args = build_parser().parse_args(["--data-dir", "x"])
    assert args.port == 8081
    assert DEFAULT_BROKER == "127.0.0.1:8081"
    assert BrokerConfig().port == 0, "an embedded broker (tests, demos) takes a free port"
    assert build_parser().parse_args(["--data-dir", "x", "--port", "0"]).port == 0


def test_the_log_level_is_checked_and_case_insensitive() -> None:
    assert build_parser().parse_args(["--data-dir", "x", "--log-level", "debug"]).log_level == (
        "DEBUG"
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--data-dir", "x", "--log-level", "loud"])


def test_both_commands_print_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert (result.exit_code, result.output) == (0, f"ordermq {sdk.__version__}\n")
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"mockbroker {sdk.__version__}\n"


def test_the_version_is_the_installed_package_version() -> None:
    # sdk/_version.py is the one place the version is written; pyproject.toml takes it
    # from there, so the metadata pip installs and what the commands report agree.
    assert importlib.metadata.version("ordermq") == sdk.__version__


def test_broker_status_units_are_for_people() -> None:
    assert [_duration(s) for s in (0, 5.9, 218.141, 3600, 7501, 90061)] == [
        "0s", "5s", "3m 38s", "1h 0m", "2h 5m", "1d 1h"
    ]  # fmt: skip
    assert [_bytes(n) for n in (0, 1023, 1536, 5 * 2**20, 3 * 2**40)] == [
        "0 B", "1023 B", "1.5 KiB", "5.0 MiB", "3.0 TiB"
    ]  # fmt: skip
    assert [_rate(r) for r in (0, 3.14159, 140.85678377749738)] == ["0", "3.1", "141"]
