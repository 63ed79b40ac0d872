"""The configuration reference is generated from the code and complete."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from mockbroker.config import BrokerConfig
from sdk.consumer.config import LitePullConsumerConfig, PushConsumerConfig
from sdk.producer.config import AccumulatorConfig, ProducerConfig
from tests.support import ROOT


def test_the_configuration_reference_is_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_config_docs.py"), "--check"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_config_field_appears_in_the_reference() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    for cls in (BrokerConfig, ProducerConfig, AccumulatorConfig, PushConsumerConfig,
                LitePullConsumerConfig):  # fmt: skip
        for field in dataclasses.fields(cls):
            assert f"| `{field.name}` |" in text, f"{cls.__name__}.{field.name}"
