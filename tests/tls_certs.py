"""Certificates made on the fly for TLS tests (trustme: a CA and the certificates it signs)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import trustme

#: The names the broker's certificates carry: the addresses tests connect to.
BROKER_NAMES = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Issued:
    """A CA's certificate file, and a server and a client certificate it signed."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path


def issue(directory: Path, name: str = "ca", **validity: datetime.datetime) -> Issued:
    """A new CA in `directory`/`name`-*.pem and certificates it signed.

    `validity`: not_before / not_after of the server certificate.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert(*BROKER_NAMES, **validity)
    client = ca.issue_cert("client.ordermq.test")
    issued = Issued(
        ca=directory / f"{name}-ca.pem",
        cert=directory / f"{name}-server.pem",
        key=directory / f"{name}-server.key",
        client_cert=directory / f"{name}-client.pem",
        client_key=directory / f"{name}-client.key",
    )
    ca.cert_pem.write_to_path(str(issued.ca))
    _write_chain(server, issued.cert)
    server.private_key_pem.write_to_path(str(issued.key))
    _write_chain(client, issued.client_cert)
    client.private_key_pem.write_to_path(str(issued.client_key))
    return issued


def _write_chain(cert: trustme.LeafCert, path: Path) -> None:
    path.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
