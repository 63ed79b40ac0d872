"""The console's WSGI application: routes, forms, access, and the lag chart.

    GET  /                      the broker: status, rates, disk, ports
    GET  /topics                every topic; a form to create one
    POST /topics                create a topic (topic, queue_count)
    GET  /topics/NAME           a topic's queues and their offsets
    GET  /groups                every consumer group
    GET  /groups/NAME           members, per queue lock owner, epoch, committed offset, lag;
                                the group's lag over the time the page was watched
    POST /groups/NAME/reset     reset offsets: first a confirmation page, then the reset

A refusal (bad input, an unknown topic, a group with live members) is shown on the page
with the broker's words, with status 400 or 404, and changes nothing. With an ACL the
console asks for an admin account's access key and secret key (HTTP Basic, so serve it
over TLS: it is served with the broker's certificate when the broker has one).
"""

from __future__ import annotations

import base64
import hmac
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote
from wsgiref.types import StartResponse, WSGIEnvironment

from grpc import StatusCode
from markupsafe import Markup

from mockbroker.acl import Acl
from mockbroker.errors import BrokerError
from mockbroker.fronts.console.admin_calls import AdminCalls
from mockbroker.fronts.console.templates import environment

#: Pages that change while watched reload themselves this often (seconds).
REFRESH_SECONDS = 5
#: A form body larger than this is refused (413): the forms hold a few short fields.
MAX_FORM_BYTES = 16 * 1024
#: Lag samples kept per group (one per view of its page: at REFRESH_SECONDS, ten minutes).
LAG_SAMPLES = 120

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

    def __init__(self, admin: AdminCalls, fronts: Fronts, acl: Acl | None) -> None:
        self._admin = admin
        self._fronts = fronts
        self._acl = acl
        self._env = environment()
        self.lag = LagHistory()

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
        method = environ.get("REQUEST_METHOD", "GET")
        path = unquote(environ.get("PATH_INFO", "/"))
        parts = [p for p in path.split("/") if p]
        try:
            if method in ("GET", "HEAD"):
                return self._get(parts)
            if method == "POST":
                form = _form(environ)
                if parts == ["topics"]:
                    return self._create_topic(form)
                if len(parts) == 3 and parts[0] == "groups" and parts[2] == "reset":
                    return self._reset(parts[1], form)
            return Page("405 Method Not Allowed", self._render("message", "Not allowed",
                        error=f"{method} {path} is not something the console does"),
                        (("Allow", "GET, HEAD, POST"),))  # fmt: skip
        except _FormError as exc:
            return Page(exc.status, self._render("message", "Not accepted", error=str(exc)))
        except BrokerError as exc:
            status = "404 Not Found" if exc.status is StatusCode.NOT_FOUND else "400 Bad Request"
            return Page(status, self._render("message", "Refused", error=_words(exc)))

    def _get(self, parts: list[str]) -> Page:
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
        progress = self._admin.call("ConsumerProgress", group=group)
        total = sum(int(q["lag"]) for q in progress["queues"])
        chart = lag_chart(self.lag.add(group, total))
        topics = sorted({q["queue"]["topic"] for q in progress["queues"]})
        return self._ok("group", f"Group {group}", p=progress, group=group, total_lag=total,
                        chart=chart, topics=topics, refresh=REFRESH_SECONDS)  # fmt: skip

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

    def _admitted(self, environ: WSGIEnvironment) -> bool:
        header = environ.get("HTTP_AUTHORIZATION", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic" or self._acl is None:
            return False
        try:
            user, _, secret = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
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


def _words(exc: BrokerError) -> str:
    return f"{exc.reason}: {exc.message}" if exc.reason else exc.message
