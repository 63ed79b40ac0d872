"""The console's WSGI application: routes, forms, access, and the lag chart.

    GET  /                      the broker: status, rates, disk, ports
    GET  /topics                every topic; a form to create one
    POST /topics                create a topic (topic, queue_count)
    GET  /topics/NAME           a topic's queues and their offsets
    GET  /groups                every consumer group
    GET  /groups/NAME           members, per queue lock owner, epoch, committed offset, lag;
                                the group's lag over the time the page was watched
    POST /groups/NAME/reset     reset offsets: first a confirmation page, then the reset
    GET  /messages              find messages: by id (any form), by key or sharding key
    GET  /messages/ID           a message: body (text, JSON, hex), properties, its trace
    GET  /topics/NAME/queues/N  browse a queue from ?offset=K, a page at a time
    GET  /groups/NAME/dlq       a group's dead letters not resent yet
    POST /groups/NAME/dlq/resend  resend the oldest one or all of them, in order (asks first)

A refusal (bad input, an unknown topic, a group with live members) is shown on the page
with the broker's words, with status 400 or 404, and changes nothing. With an ACL the
console asks for an admin account's access key and secret key (HTTP Basic, so serve it
over TLS: it is served with the broker's certificate when the broker has one).
"""

from __future__ import annotations

import base64
import hmac
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, unquote
from wsgiref.types import StartResponse, WSGIEnvironment

from grpc import StatusCode
from markupsafe import Markup

from mockbroker.acl import Acl
from mockbroker.errors import BrokerError
from mockbroker.fronts.console.admin_calls import AdminCalls
from mockbroker.fronts.console.data_path import DataPath
from mockbroker.fronts.console.templates import environment
from sdk.credentials import Credentials
from sdk.errors import OrderMQError
from sdk.message import MessageExt
from sdk.message_admin import (
    by_sharding_key,
    dead_letters,
    marker_group,
    resend_dead_letters,
)

#: Pages that change while watched reload themselves this often (seconds).
REFRESH_SECONDS = 5
#: A form body larger than this is refused (413): the forms hold a few short fields.
MAX_FORM_BYTES = 16 * 1024
#: Lag samples kept per group (one per view of its page: at REFRESH_SECONDS, ten minutes).
LAG_SAMPLES = 120
#: Messages per page of a queue's browser and of a search's results.
PAGE_MESSAGES = 20
#: Of a message's body, at most this many bytes are shown (the page says how many were cut).
SHOWN_BODY_BYTES = 64 * 1024
#: A search by sharding key reads at most this many of the queue's newest messages.
SHARDING_KEY_SCAN = 10_000
#: Dead letters listed on a group's page, and resent at most by one "resend all".
DLQ_LISTED = 100
DLQ_RESEND_ALL = 1000

Fronts = Callable[[], list[tuple[str, str]]]


@dataclass(frozen=True)
class Page:
    """An answer: status line, body, extra headers."""

    status: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


class LagHistory:
    """Each group's total lag, sampled whenever its page is shown."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._samples: dict[str, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()

    def add(self, group: str, lag: int) -> list[tuple[float, int]]:
        """Note `group`'s lag now; its samples so far, oldest first."""
        with self._lock:
            samples = self._samples.setdefault(group, deque(maxlen=LAG_SAMPLES))
            samples.append((self._clock(), lag))
            return list(samples)


def lag_chart(
    samples: list[tuple[float, int]], width: int = 480, height: int = 80
) -> dict[str, Any]:
    """An SVG line of lag over time (`svg`), and the seconds it spans (`span`)."""
    if not samples:
        return {"svg": Markup(""), "span": 0}
    t0, t1 = samples[0][0], samples[-1][0]
    span = max(t1 - t0, 1e-9)
    top = max(1, max(lag for _, lag in samples))
    points = " ".join(
        f"{(t - t0) / span * width:.1f},{height - lag / top * (height - 4) - 2:.1f}"
        for t, lag in samples
    )
    svg = (
        f'<svg class="lag-chart" role="img" aria-label="lag over time" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}">'
        f'<rect width="{width}" height="{height}" fill="#f7f9fb"/>'
        f'<polyline fill="none" stroke="#2b6cb0" stroke-width="2" points="{points}"/>'
        f'<text x="4" y="12" font-size="11">{top}</text></svg>'
    )
    return {"svg": Markup(svg), "span": t1 - t0}


class ConsoleApp:
    """The WSGI application of the console."""

    def __init__(
        self, admin: AdminCalls, fronts: Fronts, acl: Acl | None, data_path: DataPath
    ) -> None:
        self._admin = admin
        self._fronts = fronts
        self._acl = acl
        self._data = data_path
        self._env = environment()
        self.lag = LagHistory()
        self._local = threading.local()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """Answer one request."""
        page = self._answer(environ)
        headers = [("Content-Type", "text/html; charset=utf-8"),
                   ("Content-Length", str(len(page.body))),
                   ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
                   ("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'"),
                   *page.headers]  # fmt: skip
        start_response(page.status, headers)
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else page.body]

    def _answer(self, environ: WSGIEnvironment) -> Page:
        if self._acl is not None and not self._admitted(environ):
            return Page(
                "401 Unauthorized",
                self._render("message", "Sign in", error="an admin account of the broker's ACL "
                             "is needed (access key as user name, secret key as password)"),
                (("WWW-Authenticate", 'Basic realm="ordermq console", charset="UTF-8"'),),
            )  # fmt: skip
        self._local.credentials = self._credentials(environ)
        method = environ.get("REQUEST_METHOD", "GET")
        path = unquote(environ.get("PATH_INFO", "/"))
        parts = [p for p in path.split("/") if p]
        try:
            if method in ("GET", "HEAD"):
                return self._get(parts, _query(environ))
            if method == "POST":
                form = _form(environ)
                if parts == ["topics"]:
                    return self._create_topic(form)
                if len(parts) == 3 and parts[0] == "groups" and parts[2] == "reset":
                    return self._reset(parts[1], form)
                if parts[:1] == ["groups"] and parts[2:] == ["dlq", "resend"] and len(parts) == 4:
                    return self._resend(parts[1], form)
            return Page("405 Method Not Allowed", self._render("message", "Not allowed",
                        error=f"{method} {path} is not something the console does"),
                        (("Allow", "GET, HEAD, POST"),))  # fmt: skip
        except _FormError as exc:
            return Page(exc.status, self._render("message", "Not accepted", error=str(exc)))
        except BrokerError as exc:
            status = "404 Not Found" if exc.status is StatusCode.NOT_FOUND else "400 Bad Request"
            return Page(status, self._render("message", "Refused", error=_words(exc)))
        except OrderMQError as exc:  # the console's own client of the broker was refused
            words = f"{exc.reason or exc.code or 'error'}: {exc}"
            return Page("400 Bad Request", self._render("message", "Refused", error=words))

    def _get(self, parts: list[str], query: dict[str, str]) -> Page:
        if parts == ["favicon.ico"]:  # every browser asks; the console has none
            return Page("204 No Content", b"")
        if not parts:
            status = self._admin.call("BrokerStatus")
            return self._ok("overview", "Overview", s=status, fronts=self._fronts(),
                            refresh=REFRESH_SECONDS)  # fmt: skip
        if parts == ["topics"]:
            return self._topics()
        if len(parts) == 2 and parts[0] == "topics":
            topic = self._admin.call("DescribeTopic", topic=parts[1])["topic"]
            return self._ok("topic", f"Topic {parts[1]}", t=topic)
        if parts == ["groups"]:
            groups = self._admin.call("ListGroups")["groups"]
            return self._ok("groups", "Consumer groups", groups=groups)
        if len(parts) == 2 and parts[0] == "groups":
            return self._group(parts[1])
        if len(parts) == 4 and parts[0] == "topics" and parts[2] == "queues":
            return self._browse(parts[1], parts[3], query.get("offset", ""))
        if parts == ["messages"]:
            return self._search(query)
        if len(parts) == 2 and parts[0] == "messages":
            return self._message(parts[1], query.get("view", ""))
        if len(parts) == 3 and parts[0] == "groups" and parts[2] == "dlq":
            return self._dlq(parts[1])
        return Page("404 Not Found", self._render("message", "Not found",
                    error=f"no page at /{'/'.join(parts)}"))  # fmt: skip

    def _topics(self, form: dict[str, str] | None = None, error: str = "") -> Page:
        topics = self._admin.call("ListTopics")["topics"]
        shown = form or {"topic": "", "queue_count": "8"}
        page = self._render("topics", "Topics", topics=topics, form=shown, error=error)
        return Page("400 Bad Request" if error else "200 OK", page)

    def _create_topic(self, form: dict[str, str]) -> Page:
        name = form.get("topic", "").strip()
        try:
            queues = int(form.get("queue_count", "8") or 8)
        except ValueError:
            return self._topics(form, f"queue count {form.get('queue_count')!r} is not a number")
        try:
            created = self._admin.call("CreateTopic", topic=name, queue_count=queues)
        except BrokerError as exc:
            return self._topics(form, _words(exc))
        where = f"/topics/{created['topic']['topic']}"
        return Page("303 See Other", b"", (("Location", where),))

    def _group(self, group: str) -> Page:
        dead = self._dead_letter_count(group)
        try:
            progress = self._admin.call("ConsumerProgress", group=group)
        except BrokerError as exc:
            # A group its members left before committing anything still has what they
            # left behind: dead letters to look at and resend, a retry topic.
            if exc.reason != "GROUP_NOT_FOUND":
                raise
            if dead is None and not self._topic_exists(f"%RETRY%{group}"):
                words = (f"GROUP_NOT_FOUND: consumer group {group!r} has no members, no "
                         "offsets, no dead letters and no retry topic")  # fmt: skip
                return Page("404 Not Found", self._render("message", "Not found", error=words))
            progress = {"client_ids": [], "queues": []}
        total = sum(int(q["lag"]) for q in progress["queues"])
        chart = lag_chart(self.lag.add(group, total))
        topics = sorted({q["queue"]["topic"] for q in progress["queues"]})
        return self._ok("group", f"Group {group}", p=progress, group=group, total_lag=total,
                        chart=chart, topics=topics, dead=dead,
                        refresh=REFRESH_SECONDS)  # fmt: skip

    def _dead_letter_count(self, group: str) -> int | None:
        """`group`'s dead letters not resent yet; None when it has no dead-letter topic."""
        dlq = f"%DLQ%{group}"
        try:
            queue = self._admin.call("DescribeTopic", topic=dlq)["topic"]["queues"][0]
        except BrokerError as exc:
            if exc.reason in ("TOPIC_NOT_FOUND", "INVALID_GROUP", "INVALID_TOPIC"):
                return None
            raise
        start = int(queue["min_offset"])
        try:
            resent = self._admin.call("ConsumerProgress", group=marker_group(group), topic=dlq)
        except BrokerError as exc:
            if exc.reason not in ("GROUP_NOT_FOUND", "INVALID_GROUP"):
                raise
        else:
            start = max(start, int(resent["queues"][0]["consumer_offset"]))
        return max(0, int(queue["max_offset"]) - start)

    def _topic_exists(self, topic: str) -> bool:
        try:
            self._admin.call("DescribeTopic", topic=topic)
        except BrokerError as exc:
            if exc.reason in ("TOPIC_NOT_FOUND", "INVALID_TOPIC"):
                return False
            raise
        return True

    def _reset(self, group: str, form: dict[str, str]) -> Page:
        topic, to = form.get("topic", ""), form.get("to", "")
        target: dict[str, Any]
        if to in ("earliest", "latest"):
            target, words = {to: True}, {"earliest": "the start", "latest": "the end"}[to]
        elif to == "offset":
            try:
                offset = int(form.get("offset", ""))
            except ValueError:
                raise _FormError(f"offset {form.get('offset', '')!r} is not a number") from None
            target, words = {"offset": offset}, f"offset {offset} on every queue"
        else:
            raise _FormError(f"reset to {to!r}: say earliest, latest or offset")
        if form.get("confirm") != "yes":
            return self._ok(
                "confirm_reset", f"Reset offsets of {group}?", group=group, topic=topic, to=to,
                to_words=words, offset=form.get("offset", ""),
            )  # fmt: skip
        done = self._admin.call("ResetOffset", group=group, topic=topic, queue_id=-1, **target)
        return self._ok("reset_done", f"Offsets of {group} on {topic} reset to {words}",
                        group=group, offsets=done["offsets"])  # fmt: skip

    # ------------------------------------------------------------------ messages
    def _search(self, query: dict[str, str]) -> Page:
        form = {"id": query.get("id", "").strip(), "topic": query.get("topic", "").strip(),
                "key": query.get("key", "").strip(), "by": query.get("by", "key")}  # fmt: skip
        found: list[MessageExt] = []
        searched = ""
        try:
            if form["id"]:
                self._admin.messages("QueryMessageById", msg_id=form["id"])
                where = f"/messages/{quote(form['id'], safe='')}"
                return Page("303 See Other", b"", (("Location", where),))
            if form["key"] or form["topic"]:
                found, searched = self._find(form)
        except _FormError as exc:
            return self._search_page(form, [], "", str(exc), exc.status)
        except BrokerError as exc:
            status = "404 Not Found" if exc.status is StatusCode.NOT_FOUND else "400 Bad Request"
            return self._search_page(form, [], "", _words(exc), status)
        return self._search_page(form, found, searched, "", "200 OK")

    def _find(self, form: dict[str, str]) -> tuple[list[MessageExt], str]:
        topic, key = form["topic"], form["key"]
        if not topic or not key:
            raise _FormError("say both the topic and the key to find")
        if form["by"] not in ("key", "sharding"):
            raise _FormError(f"find by {form['by']!r}: say key or sharding")
        self._admin.call("DescribeTopic", topic=topic)  # TOPIC_NOT_FOUND, INVALID_TOPIC
        if form["by"] == "key":
            found, _ = self._admin.messages(
                "QueryMessagesByKey", topic=topic, key=key, max_messages=PAGE_MESSAGES
            )
            return found, f"no message of {topic} has key {key!r} (keys=, not the sharding key)"
        try:
            found, queue, read = self._data.call(
                lambda b: by_sharding_key(b, topic, key, SHARDING_KEY_SCAN, PAGE_MESSAGES),
                self._local.credentials,
            )
        except OrderMQError as exc:
            raise _FormError(f"{exc.reason or exc.code or 'error'}: {exc}") from None
        return found, (
            f"none of the {read} newest messages of {topic} queue {queue.queue_id} "
            f"(where sharding key {key!r} goes) has that sharding key"
        )

    def _search_page(
        self, form: dict[str, str], found: list[MessageExt], searched: str, error: str,
        status: str,
    ) -> Page:  # fmt: skip
        page = self._render("search", "Messages", form=form, found=[_row(m) for m in found],
                            searched=searched, error=error)  # fmt: skip
        return Page(status, page)

    def _message(self, msg_id: str, view: str) -> Page:
        if view not in ("", "hex"):
            raise _FormError(f"view {view!r}: say hex, or nothing for text")
        copies, _ = self._admin.messages("QueryMessageById", msg_id=msg_id)
        # Newest first: the original is the oldest copy that is not a retry or dead letter.
        originals = [m for m in copies if not _is_copy(m.topic)]
        shown = originals[-1] if originals else copies[-1]
        trace = [_trace_copy(m) for m in reversed(copies)]
        return self._ok("message_page", f"Message {msg_id}", m=_row(shown), msg_id=msg_id,
                        body=body_view(shown.body, view), hex=view == "hex", trace=trace,
                        groups=self._consumed_by(shown) if originals else [],
                        original_kept=bool(originals))  # fmt: skip

    def _consumed_by(self, m: MessageExt) -> list[dict[str, Any]]:
        """Each group that reads `m`'s topic, and whether it committed past `m`'s offset."""
        out = []
        for g in self._admin.call("ListGroups")["groups"]:
            if m.topic not in g["topics"]:
                continue
            try:
                progress = self._admin.call("ConsumerProgress", group=g["group"], topic=m.topic)
            except BrokerError:
                continue
            for q in progress["queues"]:
                if int(q["queue"]["queue_id"]) == m.queue.queue_id:
                    committed = int(q["consumer_offset"])
                    out.append({"group": g["group"], "committed": committed,
                                "past": committed > m.queue_offset})  # fmt: skip
        return out

    def _browse(self, topic: str, queue: str, offset_text: str) -> Page:
        try:
            queue_id = int(queue)
        except ValueError:
            raise _FormError(f"queue {queue!r} is not a number") from None
        described = self._admin.call("DescribeTopic", topic=topic)["topic"]
        queues = {int(q["queue_id"]): q for q in described["queues"]}
        if queue_id not in queues:
            raise _FormError(f"topic {topic} has no queue {queue_id} "
                             f"(queues 0..{len(queues) - 1})", "404 Not Found")  # fmt: skip
        low, high = int(queues[queue_id]["min_offset"]), int(queues[queue_id]["max_offset"])
        if offset_text.strip():
            try:
                offset = int(offset_text)
            except ValueError:
                raise _FormError(f"offset {offset_text!r} is not a number") from None
            if not -(2**63) <= offset < 2**63:  # the request's int64
                raise _FormError(f"offset {offset} is outside [{low}, {high}]")
        else:
            offset = max(low, high - PAGE_MESSAGES)  # the newest page
        found, answer = self._admin.messages("BrowseQueue", topic=topic, queue_id=queue_id,
                                             offset=offset, max_messages=PAGE_MESSAGES)  # fmt: skip
        low, high = int(answer["min_offset"]), int(answer["max_offset"])
        after = int(answer["next_offset"])
        return self._ok(
            "browse", f"{topic} queue {queue_id}", topic=topic, queue_id=queue_id, offset=offset,
            low=low, high=high, found=[_row(m) for m in found],
            previous=max(low, offset - PAGE_MESSAGES) if offset > low else None,
            next=after if after < high else None,
        )  # fmt: skip

    # ------------------------------------------------------------------ dead letters
    def _dlq(self, group: str) -> Page:
        found = self._data.call(
            lambda b: dead_letters(b, group, DLQ_LISTED), self._local.credentials
        )
        return self._ok("dlq", f"Dead letters of {group}", group=group,
                        found=[_row(m) for m in found], listed=DLQ_LISTED)  # fmt: skip

    def _resend(self, group: str, form: dict[str, str]) -> Page:
        count = form.get("count", "")
        if count not in ("one", "all"):
            raise _FormError(f"resend {count!r}: say one or all")
        limit = 1 if count == "one" else DLQ_RESEND_ALL
        if form.get("confirm") != "yes":
            pending = self._data.call(
                lambda b: dead_letters(b, group, limit), self._local.credentials
            )
            if not pending:
                raise _FormError(f"group {group} has no dead letters to resend")
            return self._ok("confirm_resend", f"Resend dead letters of {group}?", group=group,
                            count=count, pending=[_row(m) for m in pending])  # fmt: skip
        credentials = self._local.credentials
        with self._data.sender(credentials) as sender:
            resent = resend_dead_letters(
                lambda body: self._data.call(body, credentials), sender.send, group, limit
            )
        return self._ok("resend_done", f"Resent {len(resent)} dead letter(s) of {group}",
                        group=group, resent=[_row(m) for m in resent])  # fmt: skip

    def _credentials(self, environ: WSGIEnvironment) -> Credentials | None:
        """The signed-in account, for the console's own client of the broker."""
        if self._acl is None:
            return None
        user, secret = _basic(environ)
        return Credentials(user, secret) if user else None

    def _admitted(self, environ: WSGIEnvironment) -> bool:
        user, secret = _basic(environ)
        if not user or self._acl is None:
            return False
        account = self._acl.rules.accounts.get(user)
        return (
            account is not None
            and account.admin
            and hmac.compare_digest(secret.encode(), account.secret_key.encode())
        )

    def _ok(self, template: str, title: str, **values: Any) -> Page:
        return Page("200 OK", self._render(template, title, **values))

    def _render(self, template: str, title: str, **values: Any) -> bytes:
        values.setdefault("error", "")
        values.setdefault("refresh", 0)
        return self._env.get_template(template).render(title=title, **values).encode()


class _FormError(Exception):
    """A form the console cannot act on (shown on the page)."""

    def __init__(self, message: str, status: str = "400 Bad Request") -> None:
        super().__init__(message)
        self.status = status


def _form(environ: WSGIEnvironment) -> dict[str, str]:
    """The urlencoded form of a POST (the first value of each field)."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise _FormError("the request's Content-Length is not a number") from None
    if length > MAX_FORM_BYTES:
        raise _FormError(f"the form is {length} bytes, over the limit of {MAX_FORM_BYTES}",
                         "413 Content Too Large")  # fmt: skip
    body = environ["wsgi.input"].read(length) if length else b""
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise _FormError("the form is not UTF-8") from None
    return {k: v[0] for k, v in fields.items()}


def _basic(environ: WSGIEnvironment) -> tuple[str, str]:
    """(user, password) of the request's HTTP Basic authorization; ("", "") if none."""
    scheme, _, encoded = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() != "basic":
        return "", ""
    try:
        user, _, secret = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return "", ""
    return user, secret


def _query(environ: WSGIEnvironment) -> dict[str, str]:
    """The query string's fields (the first value of each)."""
    text = environ.get("QUERY_STRING", "")
    if len(text) > MAX_FORM_BYTES:
        raise _FormError(f"the query is {len(text)} bytes, over the limit of {MAX_FORM_BYTES}",
                         "413 Content Too Large")  # fmt: skip
    return {k: v[0] for k, v in parse_qs(text, keep_blank_values=True).items()}


def _is_copy(topic: str) -> bool:
    return topic.startswith(("%RETRY%", "%DLQ%"))


def _row(m: MessageExt) -> dict[str, Any]:
    """What the pages show of a message (its body only as a short preview)."""
    preview = m.body[:80].decode(errors="replace")
    return {
        "topic": m.topic, "queue_id": m.queue.queue_id, "offset": m.queue_offset,
        "msg_id": m.msg_id, "tags": m.tags or "", "key_list": list(m.keys),
        "sharding_key": m.sharding_key or "", "properties": dict(sorted(m.properties.items())),
        "reconsume_times": m.reconsume_times, "stored_ms": m.store_timestamp,
        "born_ms": m.born_timestamp, "size": len(m.body),
        "preview": preview + ("…" if len(m.body) > 80 else ""),
        "origin": m.properties.get("ORIGIN_TOPIC", ""),
    }  # fmt: skip


def _trace_copy(m: MessageExt) -> dict[str, Any]:
    """One stored copy of a message, in words: stored, retried by a group, dead-lettered."""
    row = _row(m)
    if m.topic.startswith("%RETRY%"):
        group = m.topic.removeprefix("%RETRY%")
        row.update(kind="retried", group=group,
                   words=f"sent back by group {group} for retry {m.reconsume_times}")  # fmt: skip
    elif m.topic.startswith("%DLQ%"):
        group = m.topic.removeprefix("%DLQ%")
        words = f"dead-lettered by group {group} after {m.reconsume_times} retries"
        row.update(kind="dead-lettered", group=group, words=words)
    else:
        row.update(kind="stored", group="", words="stored by its producer")
    return row


def body_view(body: bytes, view: str = "") -> dict[str, Any]:
    """How a body is shown: as text (UTF-8), JSON pretty-printed, or hex; and how much was cut.

    `view` "hex" asks for hex whatever the body is. At most SHOWN_BODY_BYTES of the body
    are shown; `cut` says how many bytes were left out.
    """
    kind = "hex"
    text = ""
    if view != "hex":
        try:
            text = body.decode()
            kind = "text"
        except UnicodeDecodeError:
            pass
    if kind == "text":
        try:
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            kind = "json"
        except ValueError:
            pass
        encoded = text.encode()
        shown = encoded[:SHOWN_BODY_BYTES].decode(errors="ignore")  # whole characters
        cut = len(encoded) - len(shown.encode())
        return {"kind": kind, "text": shown, "cut": cut, "size": len(body)}
    part = body[:SHOWN_BODY_BYTES]
    lines = [
        f"{i:08x}  {part[i:i + 16].hex(' '):<47}  "
        + "".join(chr(c) if 32 <= c < 127 else "." for c in part[i : i + 16])
        for i in range(0, len(part), 16)
    ]  # fmt: skip
    return {"kind": "hex", "text": "\n".join(lines), "cut": len(body) - len(part),
            "size": len(body)}  # fmt: skip


def _words(exc: BrokerError) -> str:
    return f"{exc.reason}: {exc.message}" if exc.reason else exc.message
