"""BrokerConfig refuses numbers the broker cannot work with, naming the option.

Before, NaN and infinity passed every float option's range check (a comparison with NaN
is False): `--lock-lease-seconds nan` started a broker on which every queue lock had
expired as soon as it was granted, so two consumers could hold one queue;
`--flush-interval-seconds nan` had the flusher loop without pause. `metrics_port` was
left out of the ports' checks: -1 or 99999 failed only when the page was served, and it
could share a port with another server.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from mockbroker import BrokerConfig

FLOAT_OPTIONS = [f.name for f in dataclasses.fields(BrokerConfig) if f.type == "float"]


def test_the_broker_has_float_options_to_check() -> None:
    assert "lock_lease_seconds" in FLOAT_OPTIONS and len(FLOAT_OPTIONS) > 10


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", FLOAT_OPTIONS)
def test_a_float_option_that_is_not_finite_is_refused(name: str, bad: float) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a finite number, not {bad}"):
        BrokerConfig(**{name: bad})  # type: ignore[arg-type]


@pytest.mark.parametrize("port", [-1, 65536])
def test_the_metrics_port_is_checked_as_the_other_ports(port: int) -> None:
    with pytest.raises(ValueError, match=f"metrics_port {port} is outside 0..65535"):
        BrokerConfig(metrics_port=port)
    with pytest.raises(ValueError, match="port and metrics_port are both 9100"):
        BrokerConfig(port=9100, metrics_port=9100)
    assert BrokerConfig(metrics_port=0).metrics_port == 0
