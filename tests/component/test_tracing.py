"""OpenTelemetry: a message's consume span continues its send span's trace.

Runs in a subprocess: a tracer provider is process-global and would stay set for the
other tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from mockbroker import EmbeddedBroker
from sdk import Message, Producer, tracing
from tests.component.pulling import read_queue
from tests.support import ROOT

SCRIPT = textwrap.dedent(
    """
    import json, tempfile, threading
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from mockbroker import BrokerConfig, EmbeddedBroker
    from sdk import (ConsumeFromWhere, ConsumeOrderlyStatus, Message, MessageListenerOrderly,
                     Producer, PushConsumer)

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    done = threading.Event()

    class Listener(MessageListenerOrderly):
        def consume_message(self, msgs, context):
            done.set()
            return ConsumeOrderlyStatus.SUCCESS

    with tempfile.TemporaryDirectory() as d, EmbeddedBroker(BrokerConfig(data_dir=d)) as b:
        with Producer(b.address) as p:
            sent = p.send(Message("orders", b"traced", sharding_key="k",
                                  properties={"app": "kept"}))
        c = PushConsumer("g", b.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET)
        c.subscribe("orders")
        c.register_message_listener(Listener())
        with c:
            assert done.wait(20)
    spans = [
        {"name": s.name, "kind": s.kind.name, "trace": s.context.trace_id,
         "span": s.context.span_id, "parent": s.parent.span_id if s.parent else None,
         "msg_id": s.attributes.get("messaging.message.id")}
        for s in exporter.get_finished_spans()
    ]
    print(json.dumps({"msg_id": sent.msg_id, "spans": spans}))
    """
)


def test_consume_span_continues_the_send_span() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    [send] = [s for s in out["spans"] if s["kind"] == "PRODUCER"]
    [process] = [s for s in out["spans"] if s["kind"] == "CONSUMER"]
    assert send["name"] == "orders send" and process["name"] == "orders process"
    assert send["msg_id"] == process["msg_id"] == out["msg_id"]
    assert process["trace"] == send["trace"] and process["parent"] == send["span"]


def test_without_a_tracer_provider_nothing_is_added_to_messages(broker: EmbeddedBroker) -> None:
    assert not tracing.enabled()
    with Producer(broker.address) as producer:
        sent = producer.send(Message("orders", b"plain", properties={"app": "kept"}))
    [got] = read_queue(broker.address, sent.queue)
    assert got.properties == {"app": "kept"}
