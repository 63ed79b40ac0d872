"""bench/profile_shares.py folds py-spy's stacks into the parts the write-up quotes."""

from __future__ import annotations

import sys

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import profile_shares as ps

ENTRY = "<module> (mockbroker/__main__.py:5);main (mockbroker/__main__.py:40)"
LOOP = "BaseEventLoop._run_once (asyncio/base_events.py:1909);Handle._run (asyncio/events.py:80)"
GRPC = "0x7f01 (grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so)"


def raw(*stacks: tuple[str, int]) -> str:
    return "\n".join(f"{stack} {n}" for stack, n in stacks) + "\n"


def test_waits_below_the_innermost_python_frame_are_idle_and_not_counted() -> None:
    shares = ps.fold(
        raw(
            (f"{ENTRY};{LOOP};EpollSelector.select (selectors.py:468);epoll_wait (libc.so.6)", 7),
            # libc's own frames are unnamed: the lock acquire above them says it waits
            ("_worker (concurrent/futures/thread.py:81);_queue_SimpleQueue_get (_queuemodule.c)"
             ";0x7f3 (libc.so.6)", 5),
            (f"{ENTRY};{LOOP};check_frames (mockbroker/store/records.py:90)", 4),
        )
    )  # fmt: skip
    assert (shares.busy, shares.idle) == (4, 12)
    assert shares.parts == {"check frames (validation)": 4}


def test_the_innermost_frame_of_a_part_names_it_and_system_calls_count_for_their_caller() -> None:
    send = f"{ENTRY};{LOOP};{GRPC};MessagingService.Send (mockbroker/service.py:98)"
    shares = ps.fold(
        raw(
            (f"{send};MessageStore.append (mockbroker/store/message_store.py:224)"
             ";build_records (mockbroker/store/records.py:170);crc32_z (libz.so.1)", 3),
            (f"{send};MessageStore.append (mockbroker/store/message_store.py:237)"
             ";MessageIndex.add (mockbroker/store/message_index.py:40);write (libc.so.6)", 2),
            (f"{send};ABCMeta.__instancecheck__ (<frozen abc>:119)", 1),
            (f"{ENTRY};{LOOP};{GRPC};sendmsg (libc.so.6)", 6),
            (f"{ENTRY};{LOOP};{GRPC}", 2),
            (f"{ENTRY};{LOOP}", 1),
            # what our code calls into is counted there, not as our code
            (f"{ENTRY};{LOOP};Exchange.call (sdk/_transport/exchange.py:80);"
             "_AioCall.write (grpc/aio/_call.py:500);sendmsg (libc.so.6)", 3),
            ("Flusher._execute (mockbroker/store/flush.py:125);CommitLog.execute_flush "
             "(mockbroker/store/commitlog.py:150);os_fdatasync (libpython3.11.so);"
             "fdatasync (libc.so.6)", 4),
        )
    )  # fmt: skip
    assert shares.parts == {
        "build records (layout, CRC)": 3,
        "id/key index": 2,  # its write() is the index's, not gRPC's
        "other broker code": 1,
        "gRPC runtime (C core, cython, its system calls)": 6 + 2 + 3,
        "asyncio event loop": 1,
        "fsync": 4,
    }
    assert "build records (layout, CRC)" in shares.table("broker")


def test_push_subscriptions_and_credits_are_a_part_of_their_own() -> None:
    # the push workloads' broker side (issue 40): the subscription loop and its credit,
    # not "other broker code"; a send through the same module stays where it was
    push = f"{ENTRY};{LOOP};{GRPC};MessagingService.Exchange (mockbroker/service.py:300)"
    shares = ps.fold(
        raw(
            (f"{push};Delivery.subscribe (mockbroker/delivery.py:590)", 3),
            (f"{push};Credit.spend (mockbroker/push.py:57)", 2),
            (f"{push};Delivery._send (mockbroker/delivery.py:120)", 1),
        )
    )
    assert shares.parts == {"push delivery (credits, subscriptions)": 5, "other broker code": 1}
    assert {"consume-push-batch1", "consume-push-batch32", "consume-push-threads-batch1"} <= set(
        ps.WORKLOADS
    )
