"""A stored message found by any id a client prints, for the fronts' lookups by id.

The forms, tried in this order:

- 32 hex digits: an ordermq id, or a RocketMQ 4.x UNIQ_KEY in the Java layout (the id
  RocketMQ's clients print): the id records are stored under.
- 32 or 56 hex digits: a RocketMQ 4.x offsetMsgId (a send reply's, or `queryMsgById`'s),
  which names the record's commit-log position; only a record that starts there is
  answered (MessageStore.read_at).
- 34 hex digits: a RocketMQ 5 message id ("01" and 16 bytes), or any other UNIQ_KEY a
  client made (Go's lower-case one): stored under a hash of it, and answered only where
  the record carries that very UNIQ_KEY.

Half messages of transactions (pending, rolled back or dropped, and the half record of a
committed one) are skipped (`skip`): they are no message of the topic their header names
until committed, and a committed one is found by its committed copy, as RocketMQ, which
keeps them under its half topic, does not find them under their real topic either.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable

from mockbroker.errors import invalid
from mockbroker.store.message_store import MessageStore
from sdk._remoting.message_ids import decode_offset_msg_id
from sdk._remoting.translate import msg_id_for_uniq_key, rocketmq_uniq_key
from sdk._wire import iter_records

#: What `find_by_any_id` takes, for the error that names them.
ID_FORMS = (
    "an ordermq id or RocketMQ 4.x UNIQ_KEY (32 hex digits), a RocketMQ 4.x offsetMsgId "
    "(32 hex digits, 56 for an IPv6 broker) or a RocketMQ 5 message id (34 hex digits, "
    "starting 01)"
)
_HEX = re.compile(r"[0-9A-Fa-f]+")
_LENGTHS = (32, 34, 56)


#: Is the record (commit-log position, record) no message of its topic (a half message)?
Skip = Callable[[int, bytes], bool]


def find_by_any_id(
    store: MessageStore, text: str, limit: int = 32, *, skip: Skip | None = None
) -> list[bytes]:
    """Stored records of the message `text` names (with its copies), newest first.

    The copies are its retries and dead letter; records `skip` says are none of the
    message's are left out. INVALID_ARGUMENT names the forms taken when `text` is none
    of them.
    """
    text = text.strip()
    if not _HEX.fullmatch(text) or len(text) not in _LENGTHS:
        raise invalid("INVALID_ARGUMENT", f"msg_id {text!r} is not {ID_FORMS}")
    if len(text) == 32:
        found = kept(store.records_by_id(bytes.fromhex(text)), limit, skip)
        if found:
            return found
    if len(text) in (32, 56):
        _host, position = decode_offset_msg_id(text)
        record = store.read_at(position)
        if record is not None:
            return kept([(position, record)], limit, skip)
    return _by_uniq_key(store, text.upper(), limit, skip) or _by_uniq_key(store, text, limit, skip)


def kept(found: Iterable[tuple[int, bytes]], limit: int, skip: Skip | None) -> list[bytes]:
    """Up to `limit` of the (position, record) `found`, those `skip` says not left out."""
    records = (data for position, data in found if skip is None or not skip(position, data))
    return list(itertools.islice(records, limit))


def _by_uniq_key(store: MessageStore, key: str, limit: int, skip: Skip | None) -> list[bytes]:
    """Records whose RocketMQ UNIQ_KEY is `key`, newest first."""
    matching = (
        (position, data)
        for position, data in store.records_by_id(msg_id_for_uniq_key(key))
        if rocketmq_uniq_key(next(iter_records(data, verify_crc=False))) == key
    )
    return kept(matching, limit, skip)
