"""The floor: a bare grpc.aio server that does no work, to compare ordermq against.

Run by bench/run.py as a separate process, like the broker. It serves two raw-bytes
unary methods (no protobuf parsing, no handler work), with the broker's channel options:

- /bench.Floor/Send: takes a request (the benchmark sends the serialized bytes of a real
  100-message SendRequest) and answers a fixed 16-byte reply, about a SendResponse's size.
- /bench.Floor/Pull: takes an 8-byte little-endian size and answers that many bytes (the
  benchmark asks for the size of one real 1 000-message PullResponse).

It prints "floor listening on HOST:PORT" when ready and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import grpc

from sdk._wire import GRPC_CHANNEL_OPTIONS

SERVICE = "bench.Floor"
SEND_REPLY = bytes(16)


# Handlers are coroutines, as the broker's are (a plain function would run in a thread pool).
async def _send(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return SEND_REPLY


_blobs: dict[int, bytes] = {}


async def _pull(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    size = int.from_bytes(request[:8], "little")
    blob = _blobs.get(size)
    if blob is None:
        blob = _blobs[size] = bytes(size)
    return blob


async def serve(host: str, port: int) -> None:
    server = grpc.aio.server(options=(*GRPC_CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)))
    handlers = {
        "Send": grpc.unary_unary_rpc_method_handler(_send),
        "Pull": grpc.unary_unary_rpc_method_handler(_pull),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print(f"floor listening on {host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
