"""Parked keys: one sharding key of a queue set aside for a group, in order, until released.

Key mode (issue 20) lets a consumer choose, for a key whose message keeps failing, to park
it rather than stall its queue's other keys or skip the message: the key's messages from
the failing one on are copied, in order, to the group's parked topic `%PARKED%<group>`
(each with its origin: ORIGIN_TOPIC, ORIGIN_QUEUE_ID, ORIGIN_QUEUE_OFFSET, and the reason
in PARKED_REASON), and the group's pulls of that queue skip them. Messages of the key
that arrive later are copied there too as pulls meet them, so the key stays in order.

An operator releases the key (`ordermq parked release`): the broker appends the parked
messages, and those of the key not copied yet, to the end of their queue in their order,
in one write, and from then on the group's pulls skip the key's messages before that
point (their copies come after). So the key's messages reach the group once each, in the
order they were sent, whichever consumer owns the queue meanwhile.

The state is a small JSON file (`parking.json`, replaced atomically); the parked topic is
where the messages are. Pulls save it as they copy a parked key's new messages, so it is
written in a worker thread (its fsyncs wait on the disk: on the event loop they would hold
up every client); a release writes it on the loop, where no other write can come between
its save and its append. A release saves the state first (a failed save changes nothing),
then appends; a crash between the two is finished at the next start (`Parking.recover`),
so the messages go back once. A crash between a copy and the state naming it leaves a copy
nobody names: the next pull copies the message again, and only named copies are
released. A released key is forgotten once the group's committed offset of its queue has
passed its release point.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grpc import StatusCode

from mockbroker.errors import BrokerError, invalid, not_found
from mockbroker.retry import copy_frame
from mockbroker.schedule import frame_of
from mockbroker.store.files import write_atomically
from mockbroker.store.message_store import GetResult, MessageStore
from mockbroker.store.records import check_frames, with_properties
from mockbroker.topics import Topic, check_group
from sdk._files import parse_json
from sdk._validation import PARKED_PREFIX
from sdk._wire import RECORD, iter_records
from sdk.clock import Clock
from sdk.errors import CorruptFileError

log = logging.getLogger("mockbroker.parking")

PARKING_FILE = "parking.json"
#: The property a parked copy carries: why its key was parked.
REASON_PROPERTY = "PARKED_REASON"
MAX_REASON_CHARS = 1024
#: Properties a released message goes back without (they describe its parked copy).
_COPY_PROPERTIES = ("ORIGIN_TOPIC", "ORIGIN_QUEUE_ID", "ORIGIN_QUEUE_OFFSET", REASON_PROPERTY)


def parked_topic(group: str) -> str:
    """The group's parked topic (one queue), named as its retry and dead-letter topics."""
    return PARKED_PREFIX + group


@dataclass
class ParkedKey:
    """One key of one queue, parked (or released, until the group's offset passes it)."""

    group: str
    topic: str
    queue_id: int
    key: str
    reason: str
    parked_at_ms: int
    #: Offsets of the queue up to this one were seen: the key's messages among them are
    #: in `copies` (parked) or were sent back to the queue's end (released).
    through: int
    #: Offsets of the key's copies in the parked topic, in the queue's order.
    copies: list[int] = field(default_factory=list)
    released_at_ms: int = 0
    #: `through` when released: the key's messages after it not in `copies` went back too.
    parked_through: int = -1
    #: How many messages the release sends back, at the queue's offsets after `through`.
    released_count: int = 0

    @property
    def released(self) -> bool:
        """True once an operator released it (its copies are back in the queue)."""
        return self.released_at_ms > 0


QueueKey = tuple[str, str, int]  # group, topic, queue id


class Parking:
    """The parked keys of every group, on the broker's store and clock."""

    def __init__(
        self,
        store: MessageStore,
        clock: Clock,
        system_topic: Callable[[str], Awaitable[Topic]],
        check_holder: Callable[[str, tuple[str, int], str, int], None],
        committed: Callable[[str, str, int], int | None],
        path: Path | None,
    ) -> None:
        self._check_holder = check_holder  # the rule of a commit: the live lock, its epoch
        self._committed = committed  # a group's saved offset of a queue
        self._store = store
        self._clock = clock
        self._system_topic = system_topic
        self._path = path
        self._by_queue: dict[QueueKey, dict[str, ParkedKey]] = {}
        # Held by whatever changes a key's copies or releases it: a copy awaits its
        # append, and a second copy of the same messages, or a release, in between would
        # park them twice or leave copies the release did not send back.
        self._changing = asyncio.Lock()

    # ------------------------------------------------------------------ state
    def load(self) -> None:
        """Read the state file, if there is one; one that does not parse is set aside."""
        if self._path is None or not self._path.exists():
            return
        try:
            entries = parse_json(self._path.read_bytes(), _parse, self._path)
        except CorruptFileError as exc:
            aside = self._path.with_name(self._path.name + ".corrupt")
            os.replace(self._path, aside)
            log.error(
                "%s; moved to %s: no key is parked now (the parked topics keep their "
                "messages, and a key that fails again is parked again)", exc, aside,
            )  # fmt: skip
            return
        for entry in entries:
            self._by_queue.setdefault((entry.group, entry.topic, entry.queue_id), {})[entry.key] = (
                entry
            )
        log.info("%d parked keys", sum(not e.released for e in self._all()))

    def _save(self) -> None:
        """Write the state file on the loop (a release: see the module docstring).

        DISK_FULL or STORE_UNAVAILABLE (retriable) if that fails.
        """
        if self._path is None:
            return
        try:
            write_atomically(self._path, self._snapshot())
        except OSError as exc:
            raise _not_saved(exc) from exc

    async def _save_in_thread(self) -> None:
        """`_save`, the file written in a worker thread; call with `_changing` held.

        The lock is kept until the write is done, even when the caller is cancelled: the
        next save must not write the file at the same time.
        """
        if self._path is None:
            return
        work = asyncio.ensure_future(
            asyncio.to_thread(write_atomically, self._path, self._snapshot())
        )
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            await asyncio.wait([work])
            raise
        except OSError as exc:
            raise _not_saved(exc) from exc

    def _snapshot(self) -> bytes:
        data = {"version": 1, "keys": [asdict(e) for e in self._all()]}
        return json.dumps(data, indent=1).encode()

    def _all(self) -> list[ParkedKey]:
        return [e for keys in self._by_queue.values() for e in keys.values()]

    def entries(self, group: str | None = None) -> list[ParkedKey]:
        """Every parked (and released, not yet forgotten) key, of one group or all."""
        return [e for e in self._all() if group is None or e.group == group]

    async def forget_passed(self) -> None:
        """Forget every released key its group's committed offset has passed."""
        for queue in {(e.group, e.topic, e.queue_id) for e in self._all() if e.released}:
            await self._forget_passed(*queue)

    # ------------------------------------------------------------------ parking
    async def park(
        self,
        group: str,
        topic: Topic,
        queue_id: int,
        key: str,
        from_offset: int,
        reason: str,
        *,
        client_id: str,
        epoch: int,
    ) -> ParkedKey:
        """Park `key` of the queue for `group` from `from_offset` on; its entry.

        Only the client holding the queue's lock, at its epoch, may (as for a commit).
        The key's messages from there to the queue's end are copied to the parked topic
        before this returns (durable as the flush mode promises). Parking a key parked
        already copies what is new and keeps its first reason.
        """
        check_group(group)
        topic.check_queue(queue_id)
        self._check_holder(group, (topic.name, queue_id), client_id, epoch)
        if len(reason) > MAX_REASON_CHARS:
            raise invalid("INVALID_ARGUMENT", f"reason is over {MAX_REASON_CHARS} characters")
        cq = self._store.queue(topic, queue_id)
        if not cq.min_offset <= from_offset < cq.max_offset:
            raise BrokerError(
                StatusCode.OUT_OF_RANGE,
                "INVALID_OFFSET",
                f"offset {from_offset} of {topic.name} queue {queue_id} is outside "
                f"[{cq.min_offset}, {cq.max_offset})",
            )
        # The copies are new data: refused (DISK_FULL) while sends are, before any change.
        self._store.check_accepting_sends()
        async with self._changing:
            return await self._park(group, topic, queue_id, key, from_offset, reason)

    async def _park(
        self, group: str, topic: Topic, queue_id: int, key: str, from_offset: int, reason: str
    ) -> ParkedKey:
        # Its creation awaits file work: done before the entry shows, so that no listing
        # shows a parked key whose messages are not copied yet for that long.
        await self._system_topic(parked_topic(group))
        cq = self._store.queue(topic, queue_id)
        queue = (group, topic.name, queue_id)
        keys = self._by_queue.setdefault(queue, {})
        entry = previous = keys.get(key)
        if entry is None or entry.released:
            entry = ParkedKey(group, topic.name, queue_id, key, reason,
                              int(self._clock.now() * 1000), from_offset - 1)  # fmt: skip
            keys[key] = entry
        try:
            await self._copy(entry, topic, cq.max_offset)
        except BaseException:
            # Not parked: the consumer tries again, and its pulls still get the key.
            if entry is not previous:
                if previous is not None:
                    keys[key] = previous
                elif keys.get(key) is entry:
                    del keys[key]
                if not keys and self._by_queue.get(queue) is keys:
                    del self._by_queue[queue]
            raise
        log.warning("group %s parked key %r of %s queue %d from offset %d: %s (%d messages)",
                    group, key, topic.name, queue_id, from_offset, reason,
                    len(entry.copies))  # fmt: skip
        return entry

    async def _copy(self, entry: ParkedKey, topic: Topic, end: int) -> None:
        """Copy the key's messages after `entry.through` up to `end` to the parked topic.

        All or nothing: when the copies cannot be written or the state not saved
        (DISK_FULL, STORE_UNAVAILABLE), `entry` is left as it was (copies written before
        a failed save are named by nobody: the next try copies the messages again).
        """
        found = self._key_records(entry, topic, end)
        copies: range = range(0)
        if found:
            parked = await self._system_topic(parked_topic(entry.group))
            extra = {REASON_PROPERTY: entry.reason}
            frames = b"".join(
                copy_frame(record, topic.name, entry.queue_id, offset, delay_level=0, extra=extra)
                for offset, record in found
            )
            checked = check_frames(frames, int(self._clock.now() * 1000))
            result = await self._store.append(parked, 0, frames, checked)
            copies = range(result.first_offset, result.first_offset + len(found))
        through, copied = entry.through, len(entry.copies)
        entry.copies.extend(copies)
        entry.through = max(entry.through, end - 1)
        try:
            await self._save_in_thread()
        except BrokerError:
            entry.through = through
            del entry.copies[copied:]
            raise

    def _key_records(self, entry: ParkedKey, topic: Topic, end: int) -> list[tuple[int, bytes]]:
        """(offset, record) of the key's messages in (entry.through, end)."""
        found = []
        wanted = entry.key.encode()
        for offset in range(
            max(entry.through + 1, self._store.queue(topic, entry.queue_id).min_offset), end
        ):
            record = self._store.read_record(topic, entry.queue_id, offset)
            if next(iter_records(record)).sharding_key == wanted:
                found.append((offset, record))
        return found

    # ------------------------------------------------------------------ pulls
    async def filter(self, group: str, topic: Topic, queue_id: int, got: GetResult) -> GetResult:
        """`got` without the messages of keys parked (or released past them) for `group`.

        A parked key's messages the pull meets after what was copied are copied now.
        """
        keys = self._by_queue.get((group, topic.name, queue_id))
        if not keys or not got.count:
            return got
        if any(e.released for e in keys.values()):
            await self._forget_passed(group, topic.name, queue_id)
            keys = self._by_queue.get((group, topic.name, queue_id))
            if not keys:
                return got
        kept: list[bytes] = []
        to_copy: set[str] = set()
        pos, records = 0, got.records
        for record in iter_records(records):
            size = RECORD.unpack_from(records, pos)[0]
            raw, pos = records[pos : pos + size], pos + size
            entry = keys.get(record.sharding_key.decode())
            if entry is None:
                kept.append(raw)
            elif record.queue_offset > entry.through:
                if entry.released:
                    kept.append(raw)
                else:
                    to_copy.add(entry.key)
        for key in to_copy:
            async with self._changing:
                entry = keys.get(key)
                # Released meanwhile: the release sent these messages back (their copies
                # come after), so they are skipped all the same.
                if entry is not None and not entry.released:
                    await self._copy(entry, topic, got.next_offset)
        if len(kept) == got.count:
            return got
        if not kept:
            return GetResult("NO_MATCHED_MESSAGE", got.next_offset, got.min_offset, got.max_offset)
        return GetResult(got.status, got.next_offset, got.min_offset, got.max_offset,
                         b"".join(kept), len(kept), got.corrupt)  # fmt: skip

    # ------------------------------------------------------------------ release
    async def release(self, group: str, topic: Topic, queue_id: int, key: str) -> ParkedKey:
        """Send the key's parked messages back to the end of their queue, in order.

        The key's messages not copied yet go with them; the group's pulls skip the key's
        messages before the release point from then on.
        """
        check_group(group)
        topic.check_queue(queue_id)
        async with self._changing:
            return await self._release(group, topic, queue_id, key)

    async def _release(self, group: str, topic: Topic, queue_id: int, key: str) -> ParkedKey:
        entry = self._by_queue.get((group, topic.name, queue_id), {}).get(key)
        if entry is None or entry.released:
            raise not_found(
                "PARKED_KEY_NOT_FOUND",
                f"key {key!r} of {topic.name} queue {queue_id} is not parked for group {group!r}",
            )
        # Refused (DISK_FULL) while sends are: the key stays parked, nothing appended.
        self._store.check_accepting_sends()
        end = self._store.queue(topic, queue_id).max_offset
        before = (entry.through, entry.released_at_ms, entry.parked_through, entry.released_count)
        entry.parked_through = entry.through
        entry.through = end - 1
        entry.released_at_ms = int(self._clock.now() * 1000)
        frames = self._release_frames(entry, topic)
        entry.released_count = len(frames)
        # The state is saved before the append, so a failed save changes nothing and a
        # release on disk is one `recover` can finish. No await until the append's write:
        # its records take the offsets from `end` on, where `recover` looks for them.
        try:
            self._save()
        except BrokerError:
            entry.through, entry.released_at_ms, entry.parked_through, entry.released_count = before
            raise
        if frames:
            data = b"".join(frames)
            try:
                written = self._store.write(
                    topic, queue_id, data, check_frames(data, int(self._clock.now() * 1000))
                )
            except BaseException:
                # Nothing written (a failed write is rolled back): parked again, if that saves.
                released = asdict(entry)
                entry.through, entry.released_at_ms, entry.parked_through, entry.released_count = (
                    before
                )
                try:
                    self._save()
                except BrokerError:
                    for name, value in released.items():  # as on disk: `recover` finishes it
                        setattr(entry, name, value)
                    log.error("group %s released key %r of %s queue %d but its %d messages "
                              "were not sent back yet: the broker's next start sends them",
                              group, key, topic.name, queue_id, len(frames))  # fmt: skip
                raise
            await self._store.durable(written.end)
        log.warning("group %s released key %r of %s queue %d: %d messages back at its end",
                    group, key, topic.name, queue_id, len(frames))  # fmt: skip
        return entry

    def _release_frames(self, entry: ParkedKey, topic: Topic) -> list[bytes]:
        """The frames a release of `entry` (its fields set as released) sends back, in order."""
        frames = []
        if entry.copies:  # then _copy created the parked topic
            parked = self._store.topics.get(parked_topic(entry.group))
            frames = [
                _without_copy_properties(self._store.read_record(parked, 0, offset))
                for offset in entry.copies
            ]
        later = dataclasses.replace(entry, through=entry.parked_through)
        frames += [
            _without_copy_properties(record)
            for _, record in self._key_records(later, topic, entry.through + 1)
        ]
        return frames

    async def recover(self) -> None:
        """Finish the releases a crash cut off between saving the state and the append.

        Run once after `load`, before any write to the queues: the records of a release
        start at its `through` + 1, so those there are a prefix of its frames, and only
        the rest are appended.
        """
        for entry in self._all():
            if not entry.released:
                continue
            topic = self._store.topics.find(entry.topic)
            if topic is None:
                continue
            start = entry.through + 1
            present = self._store.queue(topic, entry.queue_id).max_offset - start
            if present < 0:
                # The queue lost its tail (async flush): the release point moves back to
                # its end, or the group's pulls would skip the key in what is sent next.
                end = self._store.queue(topic, entry.queue_id).max_offset
                log.error("released key %r of %s queue %d: the queue ends at %d, before its "
                          "release point %d; its messages go back from there",
                          entry.key, entry.topic, entry.queue_id, end, start)  # fmt: skip
                entry.through = end - 1
                entry.parked_through = min(entry.parked_through, end - 1)
                entry.released_count = len(self._release_frames(entry, topic))
                self._save()
                present = 0
            if present >= entry.released_count:
                continue
            frames = self._release_frames(entry, topic)[present:]
            data = b"".join(frames)
            await self._store.append(
                topic, entry.queue_id, data, check_frames(data, int(self._clock.now() * 1000))
            )
            log.warning("group %s released key %r of %s queue %d: %d messages a crash cut "
                        "off sent back", entry.group, entry.key, entry.topic,
                        entry.queue_id, len(frames))  # fmt: skip

    async def forget(self, which: Callable[[ParkedKey], bool]) -> int:
        """Forget the keys `which` picks (their group or topic was deleted); how many."""
        async with self._changing:
            gone = 0
            for queue, keys in list(self._by_queue.items()):
                for key, entry in list(keys.items()):
                    if which(entry):
                        del keys[key]
                        gone += 1
                if not keys:
                    del self._by_queue[queue]
            if gone:
                await self._save_in_thread()
            return gone

    async def _forget_passed(self, group: str, topic: str, queue_id: int) -> None:
        """Forget the queue's released keys its group committed past: it skips no more."""
        offset = self._committed(group, topic, queue_id)
        if offset is not None:
            await self.forget(
                lambda e: (
                    (e.group, e.topic, e.queue_id) == (group, topic, queue_id)
                    and e.released
                    and offset > e.through
                )
            )


def _not_saved(exc: OSError) -> BrokerError:
    return BrokerError(
        StatusCode.UNAVAILABLE,
        "DISK_FULL" if exc.errno == errno.ENOSPC else "STORE_UNAVAILABLE",
        f"the parked keys were not saved ({exc}); retry later",
    )


def _without_copy_properties(record: bytes) -> bytes:
    """A parked copy's message as a frame to store again: without its copy properties."""
    return with_properties(bytes(frame_of(record)), {}, drop=_COPY_PROPERTIES)


def _parse(data: object) -> list[ParkedKey]:
    if not isinstance(data, dict) or data.get("version") != 1:
        raise ValueError("not a parking file of version 1")
    entries = data.get("keys")
    if not isinstance(entries, list):
        raise ValueError("its keys are not a list")
    try:
        return [_entry(e) for e in entries]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"a key entry does not parse: {exc}") from None


def _entry(e: object) -> ParkedKey:
    if not isinstance(e, dict):
        raise ValueError(f"{e!r} is not an object")
    entry = ParkedKey(**e)
    texts = (entry.group, entry.topic, entry.key, entry.reason)
    numbers = (entry.queue_id, entry.parked_at_ms, entry.through, entry.released_at_ms,
               entry.parked_through, entry.released_count)  # fmt: skip
    if not all(isinstance(t, str) for t in texts) or not all(
        isinstance(n, int) for n in (*numbers, *entry.copies)
    ):
        raise ValueError(f"{e!r} has a field of the wrong type")
    return entry
