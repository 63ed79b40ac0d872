"""bench/run.py's tls group (the order its runs take turns in, its ratios, its certificates),
and the transports group's ratios."""

from __future__ import annotations

import ssl
import sys
from pathlib import Path

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import run as bench_run
from figures import Figure, Run


def figure(key: str, *values: float) -> Figure:
    f = Figure(key, key, "msg/s", {})
    f.runs = [Run(v, 1.0, int(v)) for v in values]
    return f


def test_the_three_modes_take_turns_in_alternating_order() -> None:
    bench = bench_run.Bench(bench_run.parse_args(["--only", "tls", "--runs", "3"]), Path("."))
    assert list(bench._turns()) == [
        (0, "plain"), (0, "tls"), (0, "tls_acl"),
        (1, "tls_acl"), (1, "tls"), (1, "plain"),
        (2, "plain"), (2, "tls"), (2, "tls_acl"),
    ]  # fmt: skip


def test_ratios_are_tls_medians_over_plain_ones_for_the_workloads_measured() -> None:
    figures = [
        figure("tls.plain.produce", 100, 120, 110),
        figure("tls.tls.produce", 90, 80, 99),
        figure("tls.plain.consume", 200),
        figure("tls.tls_acl.consume", 150, 160, 140),
        figure("transports.grpc.consume", 1),
    ]
    assert bench_run.tls_ratios(figures) == {"produce": 0.818}
    assert bench_run.tls_ratios(figures, "tls_acl") == {"consume": 0.75}
    lines = bench_run.tls_comparison(figures)
    assert lines.splitlines() == [
        "TLS on vs TLS off: produce (send_batch of 100, 1 in flight) 90.00 vs 110 msg/s (0.82x)",
        "TLS + ACL on vs TLS off: orderly consume (async listener, batch 32) 150 vs 200 msg/s"
        " (0.75x)",
    ]
    assert bench_run.tls_comparison(figures[4:]) == ""


def test_the_acl_written_for_the_run_parses_and_lets_the_client_do_its_work() -> None:
    from mockbroker.acl import Acl, Needs, Permission, authorize, parse_acl_text

    acl = Acl(parse_acl_text(bench_run.BENCH_ACL))
    client = bench_run.BENCH_CLIENT[0]
    consume = Needs(topic=Permission.SUB, group=Permission.SUB)
    authorize(acl, client, "127.0.0.1", Needs(topic=Permission.PUB), topic="bench-produce")
    authorize(acl, client, "127.0.0.1", consume, topic="bench-consume", group="bench-consume-1")
    assert not acl.rules.accounts[client].admin
    assert acl.rules.accounts[bench_run.BENCH_ADMIN[0]].admin


def test_the_certificates_are_made_locally_a_matching_pair_and_their_ca(tmp_path: Path) -> None:
    certs, reason = bench_run.bench_certs(tmp_path / "certs")
    assert reason is None and certs is not None
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(certs.cert, certs.key)  # the pair the broker is given
    client = ssl.create_default_context(cafile=str(certs.ca))
    assert client.cert_store_stats()["x509_ca"] == 1


def test_the_transports_line_gives_each_transports_mixed_batch_over_its_one_queue_batch() -> None:
    figures = [
        figure("transports.grpc.produce", 100, 100, 100),
        figure("transports.grpc.produce_mixed", 90, 100, 110),
        figure("transports.rocketmq.produce", 40),
        figure("transports.rocketmq.produce_mixed", 10, 12, 14),
    ]
    assert bench_run.mixed_batch_costs(figures) == {"grpc": 1.0, "rocketmq": 0.3}
    assert bench_run.transport_ratios(figures) == {"produce": 0.4, "produce_mixed": 0.12}
    line = bench_run.transport_comparison(figures)
    assert line.endswith("mixed keys over one queue: gRPC 1.00x, rocketmq:// 0.30x"), line
    assert "; produce, mixed keys 12.00 vs 100 msg/s (0.12x);" in line
    assert bench_run.mixed_batch_costs(figures[:2]) == {"grpc": 1.0}
