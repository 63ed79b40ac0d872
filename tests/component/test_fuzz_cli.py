"""The `ordermq` command's every subcommand called with hostile arguments and options.

Each command (found by walking the click group, so a new one is fuzzed without being
listed here) runs in-process against an embedded broker, given for each of its arguments
and options what a user could type by mistake: empty, huge and negative numbers, numbers
beyond what the protocol carries, text that is no number, names no broker has, control
characters, paths that are no directory, files that are no certificate. It must end with
exit status 0, 1 (an error: one line "Error: ..." on stderr) or 2 (bad usage), never with
a traceback; prompts are answered "y". After each command's examples the broker still
answers the command about the fixture's topic.
"""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner, Result
from hypothesis import given
from hypothesis import strategies as st

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, Producer
from sdk.cli import cli
from tests.fuzzing import fuzz_settings
from tests.unit.test_command_lines import click_commands

TOPIC = "orders"
#: Options never fuzzed: --follow never ends by itself, --version only prints.
NOT_FUZZED = {"follow", "version"}

TEXT = [
    "", " ", TOPIC, "no-such", "a" * 300, "bad topic", "%RETRY%g", "%DLQ%g", "\x00", "é",
    "*", "a\nb", "rmq_sys_x", "-", "--", "0", "-1", "2020-01-01", "2020-13-45T99:00",
    "FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF", "zz",
]  # fmt: skip
NUMBERS = [
    "-1", "0", "1", "7", "2147483647", "2147483648", "9223372036854775807",
    "9223372036854775808", "-9223372036854775809", "99999999999999999999999", "1.5", "nan",
    "inf", "-inf", "1e309", "x", "", " 1", "0x10",
]  # fmt: skip

texts = st.sampled_from(TEXT) | st.text(max_size=12)
numbers = st.sampled_from(NUMBERS) | st.integers().map(str) | st.floats().map(str)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    data_dir = tmp_path_factory.mktemp("fuzz-cli") / "broker"
    with EmbeddedBroker(BrokerConfig(data_dir=data_dir)) as b:
        with Producer(b.address) as producer:
            producer.send_batch(
                [Message(TOPIC, b"m%d" % i, keys=("k",), sharding_key=f"k{i}") for i in range(16)]
            )
        yield b


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Paths a user could give where a file or a directory is asked for (no absolute path
    outside this test's own directory: `broker backup` writes where it is told)."""
    base = tmp_path_factory.mktemp("fuzz-cli-files")
    (base / "full").mkdir()
    (base / "full" / "x").write_text("x")
    (base / "junk.pem").write_bytes(b"hello\xff\n")
    (base / "empty.pem").write_bytes(b"")
    return [str(base / name) for name in ("full", "junk.pem", "empty.pem", "missing", "new")] + [
        "",
        "relative/dir",
        ".",
    ]


def values(param: click.Parameter, files: list[str]) -> st.SearchStrategy[str]:
    """What a user could type for `param`."""
    if param.name == "directory" or isinstance(param.type, click.Path):
        return st.sampled_from(files)
    if isinstance(param.type, click.types.IntParamType | click.types.FloatParamType):
        return numbers
    return texts


def invocation(command: click.Command, files: list[str]) -> st.SearchStrategy[list[str]]:
    """A command line for `command`: each argument, and any of its options."""
    arguments: list[st.SearchStrategy[list[str]]] = []
    for param in command.params:
        if param.name in NOT_FUZZED:
            continue
        if isinstance(param, click.Argument):
            value = values(param, files).map(lambda v: [v])
            arguments.append(value if param.required else st.just([]) | value)
        elif isinstance(param, click.Option):
            flag = param.opts[0]
            if param.is_flag:
                arguments.append(st.sampled_from([[], [flag]]))
            else:
                given_value = values(param, files).map(lambda v, f=flag: [f, v])
                arguments.append(given_value if param.required else st.just([]) | given_value)
    return st.tuples(*arguments).map(lambda parts: [word for part in parts for word in part])


def call(broker: EmbeddedBroker, args: list[str]) -> Result:
    return CliRunner().invoke(cli, ["--broker", broker.address, *args], input="y\n" * 4)


def check(args: list[str], result: Result) -> None:
    """Exit status 0, 1 with one error line, or 2; never an exception of the command's own."""
    what = f"ordermq {' '.join(map(repr, args))}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(
            f"{what} raised {type(result.exception).__name__}: {result.exception}"
        ) from result.exception
    assert result.exit_code in (0, 1, 2), f"{what} exited {result.exit_code}"
    if result.exit_code == 1:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), f"{what}: {result.stderr!r}"


COMMANDS = {
    name.removeprefix("ordermq "): command
    for name, command in click_commands(cli)
    if not isinstance(command, click.Group)
}


def test_the_fuzz_reaches_every_command() -> None:
    assert {"topics create", "offsets reset", "messages find", "broker backup"} <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_hostile_arguments_end_in_an_error_line_or_a_usage_error(
    broker: EmbeddedBroker, files: list[str], name: str
) -> None:
    command = COMMANDS[name]

    @fuzz_settings(15, 300)
    @given(invocation(command, files))
    def run(args: list[str]) -> None:
        check([*name.split(), *args], call(broker, [*name.split(), *args]))

    run()
    described = call(broker, ["--json", "topics", "describe", TOPIC])
    assert described.exit_code in (0, 1), described.output  # 1: a `topics delete` of it
    if described.exit_code == 1:
        assert "TOPIC_NOT_FOUND" in described.stderr


ENDPOINTS = ["", "x", "h:0", "h:65536", "rocketmq://", "rocketmq://x", ":1", "[::1", "a b:1"]


@fuzz_settings(25, 300)
@given(data=st.data())
def test_hostile_connection_options_end_in_an_error_line_or_a_usage_error(
    broker: EmbeddedBroker, files: list[str], data: st.DataObject
) -> None:
    options: list[str] = []
    for param in cli.params:
        if param.name in NOT_FUZZED or not isinstance(param, click.Option):
            continue
        if param.name == "broker":
            chosen = data.draw(st.sampled_from([broker.address, *ENDPOINTS]) | texts)
            options += [param.opts[0], chosen]
        elif param.is_flag:
            options += data.draw(st.sampled_from([[], [param.opts[0]]]))
        elif data.draw(st.booleans()):
            options += [param.opts[0], data.draw(values(param, files))]
    result = CliRunner().invoke(cli, [*options, "topics", "list"])
    check([*options, "topics", "list"], result)


def test_a_tls_file_that_is_no_certificate_is_named_before_connecting(
    broker: EmbeddedBroker, files: list[str]
) -> None:
    junk = next(f for f in files if f.endswith("junk.pem"))
    result = CliRunner().invoke(cli, ["--broker", broker.address, "--tls-ca", junk, "topics",
                                      "list"])  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"Error: TLSConfig: ca_file {junk!r} holds no PEM certificate "
        "('-----BEGIN CERTIFICATE-----')"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["topics", "create", "t", "--queues", "2147483648"],
        ["messages", "find", TOPIC, "k", "--limit", "9223372036854775808"],
        ["offsets", "reset", "g", "--topic", TOPIC, "--offset", "-99999999999999999999"],
        ["offsets", "reset", "g", "--topic", TOPIC, "--queue", "2147483648", "--earliest"],
        ["parked", "release", "g", TOPIC, "k", "--queue", "-1", "--yes"],
        ["topics", "set-retention", TOPIC, "--retention-bytes-per-queue", str(2**63)],
        ["dlq", "list", "g", "--limit", "-1"],
        ["messages", "tail", TOPIC, "-n", "-1"],
    ],
)
def test_a_number_out_of_range_is_a_usage_error_naming_the_option(
    broker: EmbeddedBroker, args: list[str]
) -> None:
    # Beyond the protocol's fields these ended in a traceback (protobuf's ValueError);
    # below their minimum some printed nothing, or "resent 0 message(s)".
    result = call(broker, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Invalid value for" in result.stderr and "range" in result.stderr
