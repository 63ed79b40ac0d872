"""The remoting ports in BrokerConfig: off, free, or one port each."""

from __future__ import annotations

import pytest

from mockbroker import BrokerConfig


@pytest.mark.parametrize(
    ("ports", "words"),
    [
        ({"remoting_port": 10911, "namesrv_port": 10911}, "remoting_port and namesrv_port"),
        ({"port": 10911, "remoting_port": 10911}, "port and remoting_port"),
        ({"port": 9876, "remoting_port": 0, "namesrv_port": 9876}, "port and namesrv_port"),
        ({"v2_port": 8081, "port": 8081}, "port and v2_port"),
    ],
)
def test_two_servers_on_one_port_are_refused_naming_both(ports: dict[str, int], words: str) -> None:
    with pytest.raises(ValueError, match=f"{words} are both {next(iter(ports.values()))}"):
        BrokerConfig(**ports)  # type: ignore[arg-type]


def test_port_zero_may_be_given_to_every_server() -> None:
    config = BrokerConfig(port=0, remoting_port=0, namesrv_port=0, v2_port=0)
    assert (config.remoting_port, config.namesrv_port) == (0, 0)


@pytest.mark.parametrize("name", ["remoting_port", "namesrv_port"])
def test_a_remoting_port_out_of_range_is_refused(name: str) -> None:
    ports = {"remoting_port": 0, name: 70000}
    with pytest.raises(ValueError, match=f"{name} 70000 is outside 0..65535"):
        BrokerConfig(**ports)  # type: ignore[arg-type]
