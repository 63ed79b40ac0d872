"""The broker's HTTP pages and its duration histograms, without sockets."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pytest
from prometheus_client import CollectorRegistry, make_wsgi_app

from mockbroker.histogram import DURATION_BUCKETS, Histogram
from mockbroker.http_status import StatusApp


class Answer:
    def __init__(self) -> None:
        self.status = ""
        self.headers: dict[str, str] = {}

    def __call__(
        self, status: str, headers: list[tuple[str, str]], exc_info: object = None
    ) -> None:
        self.status, self.headers = status, dict(headers)


def request(app: StatusApp, path: str, method: str = "GET") -> tuple[str, dict[str, str], bytes]:
    answer = Answer()
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": ""}
    body: Iterable[bytes] = app(environ, answer)
    return answer.status, answer.headers, b"".join(body)


def app(readiness: str | None = None) -> StatusApp:
    return StatusApp(make_wsgi_app(CollectorRegistry()), lambda: readiness)


def test_liveness_answers_whatever_the_readiness() -> None:
    assert request(app("recovering"), "/healthz")[::2] == ("200 OK", b"ok\n")


def test_readiness_answers_503_and_the_reason_until_ready() -> None:
    assert request(app(), "/readyz")[::2] == ("200 OK", b"ready\n")
    status, headers, body = request(app("recovering the store"), "/readyz")
    assert (status, body) == ("503 Service Unavailable", b"not ready: recovering the store\n")
    assert headers["Content-Length"] == str(len(body))
    assert headers["Cache-Control"] == "no-store"


def test_the_index_lists_the_pages_and_other_paths_are_404() -> None:
    status, _, index = request(app(), "/")
    assert status == "200 OK" and all(p in index for p in (b"/metrics", b"/healthz", b"/readyz"))
    assert request(app(), "/healthz/")[0] == "404 Not Found"
    assert request(app(), "/metrics")[0] == "200 OK"


def test_head_answers_the_headers_only_and_other_methods_are_405() -> None:
    status, headers, body = request(app("stopping"), "/readyz", "HEAD")
    assert (status, body) == ("503 Service Unavailable", b"")
    assert int(headers["Content-Length"]) > 0
    status, headers, _ = request(app(), "/readyz", "POST")
    assert (status, headers["Allow"]) == ("405 Method Not Allowed", "GET, HEAD")


def test_a_histogram_counts_each_value_in_the_first_bucket_that_holds_it() -> None:
    h = Histogram((0.001, 0.01, 1.0))
    for value in (0.0005, 0.001, 0.002, 0.01, 5.0):
        h.observe(value)
    assert list(h.cumulative()) == [(0.001, 2), (0.01, 4), (1.0, 4), (math.inf, 5)]
    assert h.count == 5 and h.sum == pytest.approx(5.0135)


def test_duration_buckets_span_sub_millisecond_fsyncs_to_stalled_disks() -> None:
    assert DURATION_BUCKETS[0] <= 0.0001 and DURATION_BUCKETS[-1] >= 10
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram((0.1, 0.1))
