"""Optional OpenTelemetry tracing of sends and consumption.

A no-op unless the application installs a tracer provider (opentelemetry-sdk's
`trace.set_tracer_provider(...)`). Then each sent message gets a PRODUCER span whose
context travels in the message's properties (W3C `traceparent`), and each listener call
runs in a CONSUMER span that continues that trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from opentelemetry import propagate, trace

from sdk.message import MessageExt

_tracer = trace.get_tracer("ordermq")


def enabled() -> bool:
    """True once the application has installed a tracer provider."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


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
