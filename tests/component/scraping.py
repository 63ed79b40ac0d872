"""Reading a broker's HTTP endpoint: /metrics parsed by prometheus_client, other pages raw."""

from __future__ import annotations

import urllib.error
import urllib.request
from email.message import Message

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def fetch(port: int, path: str, method: str = "GET", **headers: str) -> tuple[int, Message, bytes]:
    """(status, headers, body) of one request to http://127.0.0.1:port/path.

    `headers`: request headers, `_` for `-` (Accept_Encoding="gzip").
    """
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    for name, value in headers.items():
        request.add_header(name.replace("_", "-"), value)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def get(port: int, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of GET http://127.0.0.1:port/path."""
    status, headers, body = fetch(port, path)
    return status, headers["Content-Type"], body.decode()


def scrape(port: int) -> Samples:
    """Every sample of /metrics, keyed by (name, sorted labels)."""
    status, _, text = get(port, "/metrics")
    assert status == 200, text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def families(port: int) -> list[Metric]:
    """The metric families of /metrics."""
    _, _, text = get(port, "/metrics")
    return list(text_string_to_metric_families(text))


def types(port: int) -> dict[str, str]:
    """Each metric family's type (counter, gauge, histogram, ...) by name."""
    return {family.name: family.type for family in families(port)}


def labelled(samples: Samples, **labels: str) -> Samples:
    """The samples carrying every one of `labels`."""
    return {
        key: value
        for key, value in samples.items()
        if all((k, v) in key[1] for k, v in labels.items())
    }
