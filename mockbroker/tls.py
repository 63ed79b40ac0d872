"""The broker's TLS: certificate files checked at start, served on every port, rotated.

`ServerTLS` reads `--tls-cert`, `--tls-key` and `--tls-client-ca`, checks them (each
problem is one line naming the file: missing, unreadable, not PEM, key not matching the
certificate, expired or not yet valid), and hands each front what it serves with: gRPC
server credentials (ordermq's gRPC, admin, RocketMQ 5) and an `ssl.SSLContext` (RocketMQ
remoting, the name server, the HTTP status page).

`reload()` (the broker calls it on SIGHUP) reads and checks the files again; if they are
good, new connections get the new certificate, connections already open keep theirs. A
bad set of files is refused whole and the old certificate stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from sdk._wire import read_in_chunks

if TYPE_CHECKING:
    from cryptography import x509

log = logging.getLogger("mockbroker.tls")

#: How long a connection to a TLS port may take to finish its handshake: a peer that
#: opens sockets and never speaks must not hold them for the default minute.
HANDSHAKE_TIMEOUT_SECONDS = 10.0


async def listen(
    accept: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    host: str,
    port: int,
    tls: ssl.SSLContext | None,
) -> tuple[asyncio.Server, int]:
    """A TCP server on host:port (0: a free port), over TLS with `tls`; the port bound.

    Its connections read at most STREAM_READ_BYTES a call (see there).
    """

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        read_in_chunks(writer)
        await accept(reader, writer)

    server = await asyncio.start_server(
        accepted, host, port, ssl=tls,
        ssl_handshake_timeout=HANDSHAKE_TIMEOUT_SECONDS if tls is not None else None,
    )  # fmt: skip
    return server, int(server.sockets[0].getsockname()[1])


async def closed_quietly(writer: asyncio.StreamWriter) -> None:
    """Wait for `writer`'s connection to close; a peer that reset it is closed too."""
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


class TLSCertificateError(ValueError):
    """A TLS file the broker cannot serve with; the message names the file and why."""


@dataclass(frozen=True)
class TLSFiles:
    """Where the broker's certificate chain, its key and the client CA (if any) are."""

    cert: Path
    key: Path
    client_ca: Path | None = None


@dataclass(frozen=True)
class _Material:
    """One checked set of files, as bytes."""

    cert_pem: bytes
    key_pem: bytes
    client_ca_pem: bytes | None
    not_after: datetime.datetime


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TLSCertificateError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise TLSCertificateError(f"{what} {path}: is a directory, not a file") from None
    except PermissionError:
        raise TLSCertificateError(f"{what} {path}: not readable (permission denied)") from None
    except OSError as exc:
        raise TLSCertificateError(f"{what} {path}: cannot be read ({exc.strerror})") from None
    return data


def _certificates(data: bytes, path: Path, what: str) -> list[x509.Certificate]:
    from cryptography import x509  # a broker without TLS never loads cryptography

    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TLSCertificateError(
            f"{what} {path}: holds no PEM certificate ('-----BEGIN CERTIFICATE-----')"
        ) from None
    return certificates


def load_material(files: TLSFiles, now: datetime.datetime) -> _Material:
    """Read and check the files; TLSCertificateError naming the first problem found."""
    cert_pem = _read(files.cert, "TLS certificate")
    key_pem = _read(files.key, "TLS key")
    leaf = _certificates(cert_pem, files.cert, "TLS certificate")[0]
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise TLSCertificateError(
            f"TLS key {files.key}: is encrypted; give the broker an unencrypted key file "
            "(readable by the broker's user only)"
        ) from None
    except ValueError:
        raise TLSCertificateError(
            f"TLS key {files.key}: holds no PEM private key ('-----BEGIN ... PRIVATE KEY-----')"
        ) from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, public) != leaf.public_key().public_bytes(der, public):
        raise TLSCertificateError(
            f"TLS key {files.key}: does not match the certificate in {files.cert}"
        )
    if leaf.not_valid_after_utc <= now:
        raise TLSCertificateError(
            f"TLS certificate {files.cert}: expired on "
            f"{leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        )
    if leaf.not_valid_before_utc > now:
        raise TLSCertificateError(
            f"TLS certificate {files.cert}: not valid before "
            f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )
    client_ca_pem = None
    if files.client_ca is not None:
        client_ca_pem = _read(files.client_ca, "TLS client CA")
        _certificates(client_ca_pem, files.client_ca, "TLS client CA")
    return _Material(cert_pem, key_pem, client_ca_pem, leaf.not_valid_after_utc)


class ServerTLS:
    """The broker's TLS settings, served on every port and rotated by `reload()`."""

    def __init__(self, files: TLSFiles) -> None:
        self.files = files
        self._material = load_material(files, _utcnow())
        self._lock = threading.Lock()  # gRPC asks for new certificates from its threads
        self._grpc_fetched = self._material
        self._context = self._new_context(self._material)
        # Contexts of asyncio servers are fixed at listen time: the one they listen with
        # hands each new connection the newest context (SNI callbacks run for every
        # handshake), so that a reload reaches new connections without a restart.
        self._listening = self._new_context(self._material)
        self._listening.sni_callback = self._pick_context

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate signed by the client CA."""
        return self.files.client_ca is not None

    @property
    def not_after(self) -> datetime.datetime:
        """When the certificate being served expires."""
        return self._material.not_after

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Credentials for a gRPC port; each new connection is served the newest files."""
        return grpc.dynamic_ssl_server_credentials(
            self._grpc_configuration(self._material),
            self._fetch_for_grpc,  # type: ignore[arg-type]  # None: no change (gRPC's docs)
            require_client_authentication=self.mutual,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The context an asyncio or socket server listens with."""
        return self._listening

    def reload(self) -> None:
        """Read the files again; new connections get them. TLSCertificateError: kept old."""
        material = load_material(self.files, _utcnow())
        context = self._new_context(material)
        with self._lock:
            self._material, self._context = material, context
        log.info("TLS certificate reloaded from %s (valid until %s UTC)",
                 self.files.cert, material.not_after.strftime("%Y-%m-%d %H:%M"))  # fmt: skip

    def _fetch_for_grpc(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            if self._material is self._grpc_fetched:
                return None  # gRPC keeps what it has
            self._grpc_fetched = self._material
            return self._grpc_configuration(self._material)

    def _pick_context(
        self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext
    ) -> None:
        with self._lock:
            connection.context = self._context

    @staticmethod
    def _grpc_configuration(material: _Material) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(material.key_pem, material.cert_pem)], root_certificates=material.client_ca_pem
        )

    def _new_context(self, material: _Material) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # The paths, not the bytes checked: ssl loads chains from files only; the files
        # were read a moment ago and are read again if they changed since.
        try:
            context.load_cert_chain(self.files.cert, self.files.key)
        except (OSError, ssl.SSLError) as exc:  # changed again since they were checked
            raise TLSCertificateError(
                f"TLS certificate {self.files.cert} and key {self.files.key}: {exc}"
            ) from None
        if material.client_ca_pem is not None:
            context.load_verify_locations(cadata=material.client_ca_pem.decode("ascii"))
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


__all__ = [
    "HANDSHAKE_TIMEOUT_SECONDS",
    "ServerTLS",
    "TLSCertificateError",
    "TLSFiles",
    "closed_quietly",
    "listen",
]
