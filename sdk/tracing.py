"""Optional OpenTelemetry tracing of sends and consumption.

A no-op unless the application installs a tracer provider (opentelemetry-sdk's
`trace.set_tracer_provider(...)`). Then each sent message gets a PRODUCER span whose
context travels in the message's properties (W3C `traceparent`), and each listener call
runs in a CONSUMER span that continues that trace.

Whether tracing is on is asked for every send and every listener call, so `enabled()`
answers from a cached state; `refresh()` reads it again (after OTEL_PYTHON_TRACER_PROVIDER
changed in the environment, or a test reset OpenTelemetry's global provider).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER

from sdk.message import MessageExt

_tracer = trace.get_tracer("ordermq")


# A provider, once installed, stays (OpenTelemetry sets it once): True is kept. Until
# then the check is whether OpenTelemetry's global was set, plus whether the environment
# names a provider, as read by the last refresh(): trace.get_tracer_provider() looks the
# variable up in os.environ on every call, which cost 0.6-1.3 us a check (issue 40).
# An OpenTelemetry without that global (a later version) gets the full check each time.
_on = False
_named_in_environment = OTEL_PYTHON_TRACER_PROVIDER in os.environ
_global_readable = hasattr(trace, "_TRACER_PROVIDER")


def enabled() -> bool:
    """True once the application has installed a tracer provider."""
    if _on:
        return True
    if _global_readable and trace._TRACER_PROVIDER is None and not _named_in_environment:
        return False
    return refresh()


def refresh() -> bool:
    """Read again whether a tracer provider is installed, and what `enabled()` says.

    Needed only after the environment's OTEL_PYTHON_TRACER_PROVIDER changed in this
    process, or after OpenTelemetry's global provider was reset (tests): a provider
    installed with `trace.set_tracer_provider` is seen without it.
    """
    global _on, _named_in_environment
    _named_in_environment = OTEL_PYTHON_TRACER_PROVIDER in os.environ
    _on = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return _on


def start_send_span(topic: str, msg_id: str) -> tuple[Any, dict[str, str]]:
    """A started PRODUCER span and the properties that carry its context."""
    span = _tracer.start_span(
        f"{topic} send",
        kind=trace.SpanKind.PRODUCER,
        attributes={
            "messaging.system": "ordermq",
            "messaging.destination.name": topic,
            "messaging.message.id": msg_id,
        },
    )
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return span, carrier


def consume_span(group: str, batch: list[MessageExt]) -> Any:
    """A context manager: a CONSUMER span around one listener call (no-op if disabled)."""
    if not enabled() or not batch:
        return nullcontext()
    return _consume_span(group, batch)


@contextmanager
def _consume_span(group: str, batch: list[MessageExt]) -> Iterator[None]:
    first = batch[0]
    parent = propagate.extract(first.properties)
    with _tracer.start_as_current_span(
        f"{first.topic} process",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "ordermq",
            "messaging.destination.name": first.topic,
            "messaging.consumer.group.name": group,
            "messaging.message.id": first.msg_id,
            "messaging.batch.message_count": len(batch),
        },
    ):
        yield
