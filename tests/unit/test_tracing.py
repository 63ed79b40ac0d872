"""sdk.tracing's cached on/off state against OpenTelemetry's global tracer provider.

OpenTelemetry sets its global provider once per process: each test here puts back the
global and the cached state it found (the monkeypatches are undone in reverse order).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.util._once import Once

from sdk import tracing


@pytest.fixture
def no_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A process without a tracer provider; the real state comes back afterwards."""
    monkeypatch.setattr(tracing, "_on", tracing._on)
    monkeypatch.setattr(tracing, "_named_in_environment", tracing._named_in_environment)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.delenv(OTEL_PYTHON_TRACER_PROVIDER, raising=False)
    assert not tracing.refresh()
    yield monkeypatch


def test_a_provider_installed_after_a_first_answer_is_seen_at_once(
    no_provider: pytest.MonkeyPatch,
) -> None:
    assert not tracing.enabled()
    trace.set_tracer_provider(TracerProvider())
    assert tracing.enabled()


def test_a_provider_named_in_the_environment_is_seen_after_refresh(
    no_provider: pytest.MonkeyPatch,
) -> None:
    assert not tracing.enabled()
    no_provider.setenv(OTEL_PYTHON_TRACER_PROVIDER, "sdk_tracer_provider")
    assert tracing.refresh()
    assert tracing.enabled()
    assert isinstance(trace.get_tracer_provider(), TracerProvider)


def test_a_provider_named_in_the_environment_at_refresh_is_loaded_on_the_first_check(
    no_provider: pytest.MonkeyPatch,
) -> None:
    no_provider.setenv(OTEL_PYTHON_TRACER_PROVIDER, "sdk_tracer_provider")
    no_provider.setattr(tracing, "_named_in_environment", True)  # as an import then reads it
    assert tracing.enabled()


def test_a_check_does_not_read_the_environment(
    no_provider: pytest.MonkeyPatch,
) -> None:
    # Each os.environ lookup cost 0.6-1.3 us, and the check runs for every send and
    # listener call (issue 40).
    class Counting(dict[str, str]):
        lookups = 0

        def __contains__(self, key: object) -> bool:
            Counting.lookups += 1
            return super().__contains__(key)

    no_provider.setattr("os.environ", Counting())
    for _ in range(3):
        assert not tracing.enabled()
    trace.set_tracer_provider(TracerProvider())
    for _ in range(3):
        assert tracing.enabled()
    assert Counting.lookups <= 1  # once, when the provider first shows


def test_without_opentelemetrys_global_every_check_asks_opentelemetry(
    no_provider: pytest.MonkeyPatch,
) -> None:
    # A later OpenTelemetry may not have the private global the quick check reads.
    no_provider.setattr(tracing, "_global_readable", False)
    assert not tracing.enabled()
    provider = TracerProvider()
    no_provider.setattr(trace, "get_tracer_provider", lambda: provider)
    assert tracing.enabled()
