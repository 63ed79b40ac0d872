"""The HTTP CONNECT proxy the Exchange port's connections take: gRPC's rules for choosing
it from the environment, and the tunnel through it (against scripted proxies)."""

from __future__ import annotations

import asyncio
import base64

import pytest

from sdk._transport.http_proxy import HttpProxy, open_tunnel, proxy_for


@pytest.mark.parametrize(
    ("environ", "host", "expected"),
    [
        ({}, "broker", None),
        ({"http_proxy": "http://p:3128"}, "broker", HttpProxy("p", 3128)),
        ({"https_proxy": "http://p"}, "broker", HttpProxy("p", 443)),  # gRPC's default port
        (  # the first set wins: grpc_proxy, https_proxy, http_proxy
            {"grpc_proxy": "http://g:1", "https_proxy": "http://s:2", "http_proxy": "http://h:3"},
            "broker",
            HttpProxy("g", 1),
        ),
        ({"grpc_proxy": "", "http_proxy": "http://h:3"}, "broker", HttpProxy("h", 3)),
        ({"http_proxy": "socks5://p:1080"}, "broker", None),  # gRPC: http:// only
        ({"http_proxy": "p:3128"}, "broker", None),
        ({"http_proxy": "http://p:port"}, "broker", None),
        ({"http_proxy": "http://p:1", "no_proxy": "example.com"}, "b.example.com", None),
        ({"http_proxy": "http://p:1", "no_proxy": "other, .example.com"}, "b.example.com", None),
        ({"http_proxy": "http://p:1", "no_proxy": "example.com"}, "broker", HttpProxy("p", 1)),
        ({"http_proxy": "http://p:1", "no_proxy": "10.0.0.0/8"}, "10.2.3.4", None),
        ({"http_proxy": "http://p:1", "no_proxy": "10.0.0.0/8"}, "11.2.3.4", HttpProxy("p", 1)),
        ({"http_proxy": "http://p:1", "no_proxy": "10.0.0.0/8"}, "b.example", HttpProxy("p", 1)),
        (  # no_grpc_proxy is read first, and alone when set
            {"http_proxy": "http://p:1", "no_grpc_proxy": "other", "no_proxy": "broker"},
            "broker",
            HttpProxy("p", 1),
        ),
    ],
)
def test_the_proxy_is_chosen_as_grpc_chooses_it(
    environ: dict[str, str], host: str, expected: HttpProxy | None
) -> None:
    assert proxy_for(host, environ) == expected


def test_a_user_and_password_go_as_basic_proxy_authorization() -> None:
    proxy = proxy_for("broker", {"http_proxy": "http://us%40er:p%3Ass@p:8080"})
    assert proxy is not None and proxy.authorization is not None
    assert proxy.authorization == "Basic " + base64.b64encode(b"us@er:p:ss").decode()


async def scripted_proxy(answer: bytes) -> tuple[asyncio.Server, HttpProxy, list[bytes]]:
    """A proxy that records the request head and answers `answer`; then it echoes what
    comes (an answer ending a head), or closes (an answer cut off)."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(answer)
        while answer.endswith(b"\r\n\r\n") and (data := await reader.read(1024)):
            writer.write(data)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, HttpProxy("127.0.0.1", port, "Basic dTpw"), heads


def test_a_tunnel_carries_bytes_once_the_proxy_says_200() -> None:
    async def main() -> None:
        server, proxy, heads = await scripted_proxy(b"HTTP/1.1 200 OK\r\nX: y\r\n\r\n")
        async with server:
            reader, writer = await open_tunnel(proxy, "::1", 8082)
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            writer.close()
        assert heads == [
            b"CONNECT [::1]:8082 HTTP/1.1\r\nHost: [::1]:8082\r\n"
            b"Proxy-Authorization: Basic dTpw\r\n\r\n"
        ]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", "407 Proxy Authentication"),
        (b"HTTP/1.1 403 Forbidden\r\n\r\n", "'HTTP/1.1 403 Forbidden' to CONNECT broker:8082"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "'SSH-2.0-OpenSSH'"),
        (b"HTTP/1.1 200", "closed the connection"),  # cut off in its answer
    ],
)
def test_a_tunnel_the_proxy_does_not_open_is_an_oserror_naming_its_answer(
    answer: bytes, words: str
) -> None:
    async def main() -> None:
        server, proxy, _ = await scripted_proxy(answer)
        async with server:
            with pytest.raises(OSError, match=r"the HTTP proxy 127\.0\.0\.1:") as raised:
                await open_tunnel(proxy, "broker", 8082)
            assert words in str(raised.value)

    asyncio.run(main())
