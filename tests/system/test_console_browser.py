"""The console in a real browser: headless Chromium (Debian's) driven by Playwright.

A broker process with `--console-port 0`, real traffic (a producer sending all along, a
consumer group), and every page loaded: no console errors, each page's screenshot saved
under build/console-screenshots (the test's artefacts) and checked to be a picture of
the page; the group's lag chart moves while its consumer is paused; an offset reset asks
for a confirmation before it changes anything. The messages pages find a message by id
and by sharding key, show its body and trace and browse its queue; a dead letter resent
from the group's dead-letter page is delivered to the group again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    Message,
    MessageListenerOrderly,
    Producer,
    PushConsumer,
)
from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk.testing import paused
from tests.browser import CHROMIUM_ARGS, chromium
from tests.support import ROOT, wait_until
from tests.system.conftest import StartBroker

pytestmark = [pytest.mark.system]

SCREENSHOTS = ROOT / "build" / "console-screenshots"


class Quiet(MessageListenerOrderly):
    def consume_message(self, msgs: object, context: object) -> ConsumeOrderlyStatus:
        return ConsumeOrderlyStatus.SUCCESS


@pytest.fixture
def page() -> Iterator[Any]:
    """A Chromium page; every console error and page error it meets is recorded."""
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = chromium()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 800})
            tab.errors = []
            tab.on("console", lambda m: tab.errors.append(m.text) if m.type == "error" else None)
            tab.on("pageerror", lambda exc: tab.errors.append(str(exc)))
            yield tab
        finally:
            browser.close()


def shot(page: Any, name: str, must_show: str) -> None:
    """Save the page's screenshot; check it shows `must_show` and is not a blank picture."""
    assert must_show in page.inner_text("main"), page.inner_text("main")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    picture = page.screenshot(path=str(path), full_page=True)
    assert picture[:8] == b"\x89PNG\r\n\x1a\n" and len(picture) > 10_000, (name, len(picture))


def lag_shown(page: Any) -> int:
    """The group page's total lag ("N messages behind in all")."""
    words = page.inner_text("main").split(" messages behind in all")[0].split()
    return int(words[-1])


def test_every_page_loads_without_errors_the_lag_chart_moves_and_a_reset_asks_first(
    tmp_path: Path, start_broker: StartBroker, page: Any
) -> None:
    broker = start_broker(tmp_path / "data", "--console-port", "0")
    console = f"http://{broker.fronts['console']}"
    stop = threading.Event()

    def traffic() -> None:
        with Producer(broker.address) as producer:
            n = 0
            while not stop.is_set():
                producer.send(Message("orders", b"order %d" % n, sharding_key=f"k{n % 50}"))
                n += 1
                time.sleep(0.005)

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    consumer = PushConsumer("billing", broker.address,
                            consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    consumer.subscribe("orders")
    consumer.register_message_listener(Quiet())
    try:
        wait_until(lambda: sender.is_alive(), 5)
        consumer.start()
        page.goto(f"{console}/")
        shot(page, "overview", "messages in / out per second")
        page.click("text=topics")
        page.wait_for_url(f"{console}/topics")
        shot(page, "topics", "orders")
        page.click("a[href='/topics/orders']")
        shot(page, "topic", "min offset")
        page.goto(f"{console}/groups")
        shot(page, "groups", "billing")
        page.goto(f"{console}/groups/billing")
        wait_until(lambda: (page.reload(), consumer.client_id in page.content())[1], 10,
                   "the group page names the consumer")  # fmt: skip
        with paused(consumer):  # its lag grows while traffic goes on
            page.reload()
            first = lag_shown(page)
            wait_until(lambda: (page.reload(), lag_shown(page) > first + 20)[1], 20,
                       "the lag to grow")  # fmt: skip
            points = page.get_attribute("svg.lag-chart polyline", "points") or ""
            assert len(points.split()) >= 3, points  # a line through the samples
            shot(page, "group", "messages behind in all")
        consumer.shutdown()
        stop.set()
        sender.join(10)
        page.reload()
        page.select_option("select[name=to]", "earliest")
        page.click("button:has-text('reset')")
        shot(page, "confirm-reset", "Move the committed offsets of group billing")
        page.click("text=yes, reset the offsets")
        shot(page, "reset-done", "reset to the start")
        assert page.errors == [], page.errors  # every page so far loaded cleanly
        page.goto(f"{console}/topics")
        page.fill("input[name=topic]", "bad name!")
        page.click("button:has-text('create')")
        assert "INVALID_TOPIC" in page.inner_text("p.error")
        shot(page, "refused", "INVALID_TOPIC")
    finally:
        stop.set()
        consumer.shutdown()
    # the refusal is a 400 page, which the browser reports; nothing else went wrong
    assert [e for e in page.errors if "status of 400" not in e] == [], page.errors


class Collect(MessageListenerOrderly):
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def consume_message(self, msgs: list[Any], context: object) -> ConsumeOrderlyStatus:
        self.bodies += [m.body for m in msgs]
        return ConsumeOrderlyStatus.SUCCESS


def test_messages_pages_and_a_dead_letter_resent_from_the_page_is_delivered_again(
    tmp_path: Path, start_broker: StartBroker, page: Any
) -> None:
    broker = start_broker(tmp_path / "data", "--console-port", "0")
    console = f"http://{broker.fronts['console']}"
    with Producer(broker.address) as producer:
        for i in range(30):
            producer.send(Message("orders", b"order %d" % i, sharding_key=f"k{i % 5}"))
        order = producer.send(Message("orders", b'{"order": 7, "items": ["tea", "cake"]}',
                                      sharding_key="cust-7", keys=["inv-7"]))  # fmt: skip
        poison = producer.send(Message("orders", b"poison", sharding_key="cust-9"))

    async def dead_letter() -> None:  # the group gives up on `poison`: a dead letter
        client = BrokerClient(broker.address)
        try:
            await client.heartbeat("w", [GroupInfo("billing", "CONSUME_ORDERLY")])
            await client.send_back("billing", poison.queue, poison.queue_offset,
                                   max_reconsume_times=1, reconsume_times=1)  # fmt: skip
            await client.unregister("w")
        finally:
            await client.close()

    # Playwright's sync API runs an event loop in this thread: the client runs in another.
    worker = threading.Thread(target=asyncio.run, args=(dead_letter(),))
    worker.start()
    worker.join(30)
    page.goto(f"{console}/")
    page.click("header >> text=messages")
    page.wait_for_url(f"{console}/messages")
    shot(page, "messages", "By key or sharding key")
    page.fill("input[name=id]", poison.msg_id)
    page.click("button:has-text('show')")
    page.wait_for_url(f"{console}/messages/{poison.msg_id}")
    shot(page, "message-trace", "dead-lettered by group billing after 1 retries")
    page.goto(f"{console}/messages")
    page.fill("input[name=topic]", "orders")
    page.fill("input[name=key]", "cust-7")
    page.select_option("select[name=by]", "sharding")
    page.click("button:has-text('find')")
    shot(page, "messages-found", "1 message(s), newest first")
    page.click(f"a[href='/messages/{order.msg_id}']")
    shot(page, "message-json", '"order": 7,')
    page.click("text=as hex")
    shot(page, "message-hex", "7b 22 6f 72 64 65 72 22")
    page.goto(f"{console}/topics/orders")
    page.click(f"a[href='/topics/orders/queues/{order.queue.queue_id}']")
    shot(page, "queue", "messages stored, offsets 0 to")
    page.goto(f"{console}/groups/billing/dlq")
    shot(page, "dlq", "poison")
    page.click("button:has-text('resend the oldest')")
    shot(page, "confirm-resend", "back to its original topic, in order")
    page.click("text=yes, resend")
    shot(page, "resend-done", "Resent 1 dead letter(s) of billing")
    assert page.errors == [], page.errors  # every page so far loaded cleanly
    page.goto(f"{console}/groups/billing/dlq")
    assert "No dead letters to resend" in page.inner_text("main")
    listener = Collect()
    consumer = PushConsumer("billing", broker.address,
                            consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    consumer.subscribe("orders")
    consumer.register_message_listener(listener)
    with consumer:  # the original and the resent copy
        wait_until(lambda: listener.bodies.count(b"poison") == 2, 20, "the resent message")
    page.goto(f"{console}/topics/orders/queues/0?offset=999")
    assert "INVALID_OFFSET" in page.inner_text("p.error")
    shot(page, "queue-refused", "INVALID_OFFSET")
    page.goto(f"{console}/messages?id=not-an-id")
    assert "is not" in page.inner_text("p.error")
    assert [e for e in page.errors if "status of 400" not in e] == [], page.errors
