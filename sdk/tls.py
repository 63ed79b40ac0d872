"""TLS for clients: `TLSConfig`, given to any client as `tls=`, and what it makes.

The same settings serve both wires: gRPC channel credentials for ordermq brokers, an
`ssl.SSLContext` for RocketMQ remoting (`rocketmq://`). Files are read when the client
is made and checked (a CA file holds PEM certificates, the client certificate and its
key are PEM, match and the key is not encrypted), so a file the client cannot use is an
`InvalidArgumentError` at once that names it, not a connection failure later.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from sdk.errors import InvalidArgumentError

__all__ = ["TLSConfig"]

#: Why `tls_refusal` thinks the client certificate (or its absence) was refused.
CLOSED_AFTER_HANDSHAKE = "the broker closed the connection right after the TLS handshake"

#: What a host name (as a certificate names it) never holds.
_NOT_IN_A_NAME = re.compile(r"[\s\x00-\x1f\x7f]")

#: What gRPC's connection errors say when the TLS handshake, not the network, failed.
_HANDSHAKE_FAILURE = re.compile(
    r"handshake failed|hostname verification|certificate_verify_failed|certificate required|"
    r"peer did not return a certificate|alert",
    re.IGNORECASE,
)


def _check_file_name(name: str, path: object) -> None:
    """InvalidArgumentError unless `path` is None or a file name a client could open.

    A name with a NUL character failed where the client read it, with ValueError.
    """
    if path is None:
        return
    if not isinstance(path, str | Path):
        raise InvalidArgumentError(
            f"TLSConfig.{name} must be a str or Path naming a PEM file, not {path!r}"
        )
    if "\0" in str(path):
        raise InvalidArgumentError(f"TLSConfig.{name} {str(path)!r} holds a NUL character")


@dataclass(frozen=True)
class TLSConfig:
    """How a client connects over TLS.

    Attributes:
        ca_file: PEM CA certificate(s) the broker's certificate must be signed by (None:
            the system's trusted roots).
        cert_file: PEM certificate chain of this client, for brokers that require client
            certificates (mutual TLS); with `key_file`.
        key_file: The client certificate's PEM private key, unencrypted.
        server_name: The name the broker's certificate must carry (None: the host of the
            address connected to). Set it when connecting by an IP address or an alias
            the certificate does not name.

    Example::

        Producer("broker.example:8081", tls=TLSConfig(ca_file="ca.pem"))
    """

    ca_file: str | Path | None = None
    cert_file: str | Path | None = None
    key_file: str | Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        for field_name in ("ca_file", "cert_file", "key_file"):
            _check_file_name(field_name, getattr(self, field_name))
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidArgumentError(
                "TLSConfig: cert_file and key_file go together (a client certificate needs "
                "its key): give both, or neither"
            )
        name = self.server_name
        if name is not None:
            if not isinstance(name, str) or not name.strip():
                raise InvalidArgumentError(
                    f"TLSConfig: server_name must be a host name, not {name!r}"
                )
            if _NOT_IN_A_NAME.search(name):
                raise InvalidArgumentError(
                    f"TLSConfig: server_name {name!r} is not a host name (it holds spaces "
                    "or control characters)"
                )

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        """GRPC channel credentials; InvalidArgumentError for a file it cannot use."""
        ca = _read(self.ca_file, "ca_file") if self.ca_file is not None else _system_roots()
        key = _read(self.key_file, "key_file") if self.key_file is not None else None
        cert = _read(self.cert_file, "cert_file") if self.cert_file is not None else None
        # gRPC reports files it cannot use only when it connects, as a failed handshake:
        # OpenSSL checks them here, by the same rules, and names the file.
        self._load_into(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        return grpc.ssl_channel_credentials(ca, key, cert)

    def grpc_options(self) -> tuple[tuple[str, str], ...]:
        """GRPC channel options these settings need."""
        if self.server_name is None:
            return ()
        return (("grpc.ssl_target_name_override", self.server_name),)

    def ssl_context(self) -> ssl.SSLContext:
        """A client SSLContext; InvalidArgumentError for a file it cannot use."""
        context = ssl.create_default_context() if self.ca_file is None else None
        context = self._load_into(context or ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    def _load_into(self, context: ssl.SSLContext) -> ssl.SSLContext:
        """`context` with the CA file and the client certificate loaded.

        InvalidArgumentError naming the file and what is wrong with it.
        """
        if self.ca_file is not None:
            ca = _read(self.ca_file, "ca_file")  # its own message for a missing file
            try:
                # Text outside the PEM blocks (a bundle's comments) may be anything.
                context.load_verify_locations(cadata=ca.decode("ascii", "ignore"))
            except (ssl.SSLError, ValueError):
                raise InvalidArgumentError(
                    f"TLSConfig: ca_file {str(self.ca_file)!r} holds no PEM certificate "
                    "('-----BEGIN CERTIFICATE-----')"
                ) from None
        if self.cert_file is not None and self.key_file is not None:
            for path, field in ((self.cert_file, "cert_file"), (self.key_file, "key_file")):
                _read(path, field)
            key_file = str(self.key_file)

            def encrypted() -> bytes:  # OpenSSL would prompt on the terminal for it
                raise InvalidArgumentError(
                    f"TLSConfig: key_file {key_file!r} is encrypted; give the client an "
                    "unencrypted key (readable by its user only)"
                )

            try:
                context.load_cert_chain(self.cert_file, self.key_file, password=encrypted)
            except ssl.SSLError as exc:
                why = f" ({exc.reason})" if exc.reason and exc.reason != "PEM lib" else ""
                raise InvalidArgumentError(
                    f"TLSConfig: cert_file {str(self.cert_file)!r} and key_file {key_file!r} "
                    f"are not a PEM certificate and its private key{why}"
                ) from None
        return context


def _read(path: str | Path, field: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(
            f"TLSConfig: {field} {str(path)!r} cannot be read: {exc.strerror or exc}"
        ) from None


def _system_roots() -> bytes | None:
    """The system's CA bundle, or None (gRPC's own bundled roots) where there is none."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate).read_bytes()
    return None


def handshake_failure(details: str) -> bool:
    """Whether a gRPC connection error's details tell of a failed TLS handshake."""
    return _HANDSHAKE_FAILURE.search(details) is not None


async def speaks_tls(address: str, timeout: float = 1.0) -> bool:
    """Whether `address` ("host:port") completes a TLS handshake (its certificate unchecked).

    Asked only after a plain-text connection failed, to tell "this port wants TLS" from
    "the broker is down".
    """
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(timeout):
            _reader, writer = await asyncio.open_connection(
                host.strip("[]"), int(port), ssl=context
            )
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    try:
        async with asyncio.timeout(timeout):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        pass
    return True


async def tls_refusal(
    address: str, tls: TLSConfig, context: ssl.SSLContext | None = None, timeout: float = 1.0
) -> str | None:
    """Why `address` refuses a TLS connection made with `tls`; None if it does not.

    Asked after a connection failed without saying why (gRPC reports a refused client
    certificate as "Socket closed"): the handshake is made again here, and the first
    read waited for briefly, since a TLS 1.3 server refuses a client certificate after
    the handshake, by closing the connection.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(
                host, int(port), ssl=context or tls.ssl_context(),
                server_hostname=tls.server_name or host,
            )  # fmt: skip
    except ssl.SSLError as exc:
        return str(exc)
    except (OSError, TimeoutError, ValueError):
        return None
    try:
        async with asyncio.timeout(timeout / 2):
            if not await reader.read(1):
                return CLOSED_AFTER_HANDSHAKE
    except ssl.SSLError as exc:
        return str(exc)
    except (OSError, TimeoutError):
        pass  # silent or sending: it took the connection
    finally:
        writer.close()
    return None


def tls_hint(details: str, tls: TLSConfig) -> str:
    """What a failed handshake's details mean for the user, and the details."""
    low = details.lower()
    start = low.find("handshake")
    reason = details[max(0, start - 4) :] if start >= 0 else details
    if any(m in low for m in ("hostname verification", "hostname mismatch", "no match found")):
        hint = (
            f"the broker's certificate does not name {tls.server_name or 'the host connected to'}"
            " (set TLSConfig.server_name to a name it carries)"
        )
    elif "certificate_verify_failed" in low or "unable to get local issuer" in low:
        hint = (
            "the broker's certificate is not signed by a CA the client trusts "
            f"(TLSConfig.ca_file: {tls.ca_file or 'the system roots'})"
        )
    elif ("certificate required" in low or "certificate_required" in low) or (
        details == CLOSED_AFTER_HANDSHAKE and tls.cert_file is None
    ):
        hint = "the broker requires a client certificate (TLSConfig.cert_file and key_file)"
    elif any(m in low for m in ("unknown ca", "unknown_ca", "bad certificate")) or (
        details == CLOSED_AFTER_HANDSHAKE
    ):
        hint = (
            "the broker does not trust the client certificate "
            f"(TLSConfig.cert_file: {tls.cert_file})"
        )
    else:
        hint = "the TLS handshake failed"
    return f"{hint}; {reason.strip()}" if reason.strip() else hint
