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

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    Message,
    MessageListenerOrderly,
    Producer,
    PushConsumer,
)
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
