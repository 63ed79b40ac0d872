"""The console (`--console-port`) over HTTP: its pages, its forms, bad input, access.

tests/system/test_console_browser.py drives the same pages in a real browser.
"""

from __future__ import annotations

import base64
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    Credentials,
    Message,
    MessageListenerOrderly,
    Producer,
    PushConsumer,
)
from sdk._transport.broker_client import BrokerClient, GroupInfo
from tests.component.admin_cli import client
from tests.support import wait_until

ACL = """\
accounts:
  - accessKey: console-admin
    secretKey: s3cret-admin-key
    admin: true
  - accessKey: app-key01
    secretKey: s3cret-app-key
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""


class Quiet(MessageListenerOrderly):
    def consume_message(self, msgs: object, context: object) -> ConsumeOrderlyStatus:
        return ConsumeOrderlyStatus.SUCCESS


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(data_dir=tmp_path / "data", port=0, console_port=0)
    with EmbeddedBroker(config) as b:
        with Producer(b.address) as p:
            p.send_batch([Message("orders", b"o%d" % i, sharding_key=f"k{i}") for i in range(40)])
        yield b


def get(broker: EmbeddedBroker, path: str, auth: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{broker.console_address}{path}")
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def get_raw(broker: EmbeddedBroker, path: str) -> tuple[int, str, str]:
    """(status, body, Location) of a GET; redirects are not followed."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(f"http://{broker.console_address}{path}", timeout=10) as r:
            return r.status, r.read().decode(), r.headers.get("Location", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers.get("Location", "")


def post(broker: EmbeddedBroker, path: str, **fields: str) -> tuple[int, str, str]:
    """(status, body, Location) of a form POST; redirects are not followed."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    data = urllib.parse.urlencode(fields).encode()
    try:
        with opener.open(f"http://{broker.console_address}{path}", data=data, timeout=10) as r:
            return r.status, r.read().decode(), r.headers.get("Location", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers.get("Location", "")


def test_the_pages_show_the_broker_its_topics_and_a_groups_lag_and_lock_owners(
    broker: EmbeddedBroker,
) -> None:
    status, page = get(broker, "/")
    assert status == 200 and "broker-a" in page and broker.address in page
    status, page = get(broker, "/topics")
    assert status == 200 and 'href="/topics/orders"' in page
    status, page = get(broker, "/topics/orders")
    assert status == 200 and '<td class="n">40</td>' not in page  # per queue, not in all
    assert page.count('<tr><td class="n">') == 8  # one row per queue
    consumer = PushConsumer("billing", broker.address,
                            consume_from_where=ConsumeFromWhere.LAST_OFFSET)  # fmt: skip
    consumer.subscribe("orders")
    consumer.register_message_listener(Quiet())
    with consumer:
        wait_until(lambda: consumer.client_id in get(broker, "/groups/billing")[1], 10,
                   "the group page names the lock owner")  # fmt: skip
        status, page = get(broker, "/groups")
        assert status == 200 and 'href="/groups/billing"' in page
        status, page = get(broker, "/groups/billing")
        assert status == 200 and 'class="lag-chart"' in page and "messages behind" in page


def test_a_topic_is_created_from_the_form_and_bad_input_changes_nothing(
    broker: EmbeddedBroker,
) -> None:
    status, _body, where = post(broker, "/topics", topic="payments", queue_count="4")
    assert (status, where) == (303, "/topics/payments")
    assert "4 queues" in get(broker, "/topics/payments")[1]
    for fields, words in [
        ({"topic": "bad name!", "queue_count": "4"}, "INVALID_TOPIC"),
        ({"topic": "x", "queue_count": "many"}, "is not a number"),
        ({"topic": "x", "queue_count": "0"}, "queue"),
        ({"topic": "payments", "queue_count": "2"}, "TOPIC_EXISTS"),
    ]:
        status, body, _ = post(broker, "/topics", **fields)
        assert status == 400 and 'class="error"' in body and words in body, (fields, body)
    assert 'href="/topics/x"' not in get(broker, "/topics")[1]
    status, body, _ = post(broker, "/topics", topic="y" * 20_000)
    assert status == 413 and "over the limit" in body
    assert get(broker, "/topics/nosuch")[0] == 404
    assert get(broker, "/no/such/page")[0] == 404


def test_an_offset_reset_asks_first_and_is_refused_while_the_group_has_members(
    broker: EmbeddedBroker,
) -> None:
    consumer = PushConsumer("billing", broker.address,
                            consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    consumer.subscribe("orders")
    consumer.register_message_listener(Quiet())
    with consumer:
        wait_until(lambda: consumer.client_id in get(broker, "/groups/billing")[1], 10,
                   "the consumer is a member")  # fmt: skip
        status, body, _ = post(broker, "/groups/billing/reset", topic="orders", to="earliest")
        assert status == 200 and "yes, reset the offsets" in body, body
        status, body, _ = post(broker, "/groups/billing/reset", topic="orders", to="earliest",
                               confirm="yes")  # fmt: skip
        assert status == 400 and "live member" in body
    status, body, _ = post(broker, "/groups/billing/reset", topic="orders", to="earliest",
                           confirm="yes")  # fmt: skip
    assert status == 200 and "reset to the start" in body
    status, body, _ = post(broker, "/groups/billing/reset", topic="orders", to="offset",
                           offset="999", confirm="yes")  # fmt: skip
    assert status == 400 and "INVALID_OFFSET" in body
    status, body, _ = post(broker, "/groups/billing/reset", topic="orders", to="sideways")
    assert status == 400 and "say earliest, latest or offset" in body


def test_with_an_acl_the_console_asks_for_an_admin_account(tmp_path: Path) -> None:
    acl = tmp_path / "acl.yml"
    acl.write_text(ACL)
    config = BrokerConfig(data_dir=tmp_path / "data", port=0, console_port=0, acl_file=acl)
    with EmbeddedBroker(config) as b:
        status, body = get(b, "/")
        assert status == 401 and "an admin account" in body
        assert get(b, "/", auth="app-key01:s3cret-app-key")[0] == 401
        assert get(b, "/", auth="console-admin:wrong")[0] == 401
        assert get(b, "/", auth="console-admin:s3cret-admin-key")[0] == 200
        # the console's own client of the broker signs with the signed-in admin's account
        status, body = get(b, "/groups/billing/dlq", auth="console-admin:s3cret-admin-key")
        assert status == 200 and "No dead letters to resend" in body, body
        app = Credentials("app-key01", "s3cret-app-key")
        with Producer(b.address, credentials=app) as p:
            p.send(Message("orders", b"signed", sharding_key="k1"))
        status, body = get(b, "/messages?topic=orders&key=k1&by=sharding",
                           auth="console-admin:s3cret-admin-key")  # fmt: skip
        assert status == 200 and ">signed<" in body, body


class Collect(MessageListenerOrderly):
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def consume_message(self, msgs: list[Any], context: object) -> ConsumeOrderlyStatus:
        self.bodies += [m.body for m in msgs]
        return ConsumeOrderlyStatus.SUCCESS


def dead_letter(broker: EmbeddedBroker, group: str, body: bytes) -> str:
    """Send `body` and dead-letter it for `group`; its message id."""
    with Producer(broker.address) as p:
        sent = p.send(Message("orders", body, sharding_key="poison-key", keys=["inv-9"]))

    async def fail(c: BrokerClient) -> None:
        await c.heartbeat("w", [GroupInfo(group, "CONSUME_ORDERLY")])
        await c.send_back(group, sent.queue, sent.queue_offset, max_reconsume_times=1,
                          reconsume_times=1)  # fmt: skip
        await c.unregister("w")

    client(broker, fail)
    return sent.msg_id


def test_a_message_is_found_by_id_key_and_sharding_key_and_shown_with_its_trace(
    broker: EmbeddedBroker,
) -> None:
    msg_id = dead_letter(broker, "billing", b'{"order": 7, "items": ["<b>x</b>"]}')
    status, _, where = get_raw(broker, f"/messages?id={msg_id}")
    assert (status, where) == (303, f"/messages/{msg_id}")
    status, page = get(broker, f"/messages/{msg_id}")
    assert status == 200, page
    assert '"order": 7,\n' in page.replace("&#34;", '"')  # pretty-printed JSON
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page  # escaped
    assert "stored by its producer" in page
    assert "dead-lettered by group billing after 1 retries" in page
    assert 'href="/groups/billing/dlq"' in page and "ORIGIN_TOPIC" not in page.split("Trace")[0]
    assert "What it cannot know" in page
    status, page = get(broker, f"/messages/{msg_id}?view=hex")
    assert status == 200 and "7b 22 6f 72 64 65 72 22" in page  # {"order"
    assert get(broker, f"/messages/{msg_id}?view=sideways")[0] == 400
    status, page = get(broker, "/messages?topic=orders&key=inv-9&by=key")
    assert status == 200 and f'href="/messages/{msg_id}"' in page
    status, page = get(broker, "/messages?topic=orders&key=k3&by=sharding")
    assert status == 200 and page.count('href="/messages/') == 1 and "o3" in page
    status, page = get(broker, "/messages?topic=orders&key=k3&by=key")
    assert status == 200 and "no message of orders has key" in page
    for query, code, words in [
        ("id=not-an-id", 400, "is not"),
        ("id=" + "f" * 32, 404, "MESSAGE_NOT_FOUND"),
        ("topic=nosuch&key=k1", 404, "TOPIC_NOT_FOUND"),
        ("topic=orders&key=", 400, "say both the topic and the key"),
        ("topic=orders&key=k1&by=color", 400, "say key or sharding"),
        ("id=" + "a" * 20_000, 413, "over the limit"),
    ]:
        status, page = get(broker, f"/messages?{query}")
        assert status == code and 'class="error"' in page and words in page, (query, page)
        assert 'name="id"' in page or code == 413  # the form is there to try again


def test_a_body_is_text_json_or_hex_and_a_huge_one_is_cut(broker: EmbeddedBroker) -> None:
    with Producer(broker.address) as p:
        binary = p.send(Message("orders", bytes(range(256)), sharding_key="b")).msg_id
        huge = p.send(Message("orders", b"z" * 300_000, sharding_key="h")).msg_id
        script = p.send(Message("orders", b"<script>alert(1)</script>", sharding_key="s")).msg_id
    page = get(broker, f"/messages/{binary}")[1]
    assert "it is not UTF-8" in page and "00000000  00 01 02 03" in page
    page = get(broker, f"/messages/{huge}")[1]
    assert "234464 more bytes not shown (of 300000)" in page
    page = get(broker, f"/messages/{script}")[1]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>" not in page


def test_a_queue_is_browsed_from_an_offset_page_by_page(broker: EmbeddedBroker) -> None:
    with Producer(broker.address) as p:
        sent = [p.send(Message("browse", b"b%d" % i, sharding_key="one")) for i in range(45)]
    queue = sent[0].queue.queue_id
    status, page = get(broker, f"/topics/browse/queues/{queue}")
    assert status == 200 and "b44" in page and "b24" not in page  # the newest page
    assert 'href="?offset=5"' in page and 'href="?offset=' in page
    status, page = get(broker, f"/topics/browse/queues/{queue}?offset=0")
    assert status == 200 and ">b0<" in page and ">b19<" in page and ">b20<" not in page
    assert 'href="?offset=20">next' in page and "previous" not in page
    assert f'href="/topics/browse/queues/{queue}"' in get(broker, "/topics/browse")[1]
    for path, code, words in [
        (f"/topics/browse/queues/{queue}?offset=999", 400, "INVALID_OFFSET"),
        (f"/topics/browse/queues/{queue}?offset=-1", 400, "INVALID_OFFSET"),
        (f"/topics/browse/queues/{queue}?offset=ten", 400, "is not a number"),
        (f"/topics/browse/queues/{queue}?offset={10**30}", 400, "is outside [0, 45]"),
        ("/topics/browse/queues/99", 404, "has no queue 99"),
        ("/topics/browse/queues/x", 400, "is not a number"),
        ("/topics/nosuch/queues/0", 404, "TOPIC_NOT_FOUND"),
    ]:
        status, page = get(broker, path)
        assert status == code and 'class="error"' in page and words in page, (path, page)


def test_a_dead_letter_resent_from_the_page_is_delivered_again(broker: EmbeddedBroker) -> None:
    msg_id = dead_letter(broker, "billing", b"poison")
    status, page = get(broker, "/groups/billing/dlq")
    assert status == 200 and ">poison<" in page and "resend the oldest" in page
    status, page, _ = post(broker, "/groups/billing/dlq/resend", count="one")
    assert status == 200 and "yes, resend" in page and ">poison<" in page
    assert ">poison<" in get(broker, "/groups/billing/dlq")[1], "nothing resent before yes"
    for fields, code, words in [
        ({"count": "some"}, 400, "say one or all"),
        ({"count": "one", "pad": "x" * 20_000}, 413, "over the limit"),
    ]:
        status, page, _ = post(broker, "/groups/billing/dlq/resend", **fields)
        assert status == code and words in page, page
    status, page, _ = post(broker, "/groups/billing/dlq/resend", count="one", confirm="yes")
    assert status == 200 and "Resent 1 dead letter(s) of billing" in page, page
    assert "No dead letters to resend" in get(broker, "/groups/billing/dlq")[1]
    status, page, _ = post(broker, "/groups/billing/dlq/resend", count="all")
    assert status == 400 and "has no dead letters to resend" in page
    listener = Collect()
    consumer = PushConsumer("billing", broker.address,
                            consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    consumer.subscribe("orders")
    consumer.register_message_listener(listener)
    with consumer:  # the original, and the copy the resend sent back to orders
        wait_until(lambda: listener.bodies.count(b"poison") == 2, 15, "the resent message")
        assert 'href="/groups/billing/dlq"' in get(broker, "/groups/billing")[1]
        consumed = "delivered and consumed (committed past it)"
        wait_until(lambda: consumed in get(broker, f"/messages/{msg_id}")[1], 15,
                   "the trace says billing consumed it")  # fmt: skip
    assert "No dead letters" in get(broker, "/groups/nosuch/dlq")[1]


def test_a_group_with_only_dead_letters_has_a_page_and_one_with_nothing_is_not_found(
    broker: EmbeddedBroker,
) -> None:
    dead_letter(broker, "billing", b"poison")  # its only member left; it never committed
    dead_letter(broker, "billing", b"poison again")
    status, page = get(broker, "/groups/billing")
    assert status == 200, page
    assert "none now" in page and "<td>orders</td>" not in page  # no members, no queues
    assert "2 dead letter(s) not resent yet" in page and 'href="/groups/billing/dlq"' in page
    post(broker, "/groups/billing/dlq/resend", count="one", confirm="yes")
    assert "1 dead letter(s) not resent yet" in get(broker, "/groups/billing")[1]
    status, page = get(broker, "/groups/nosuch")
    assert status == 404 and 'class="error"' in page, page
    assert "no members, no offsets, no dead letters and no retry topic" in page
