"""RocketMQ's message properties string: `name U+0001 value` entries joined by U+0002.

RocketMQ carries a message's properties (its tags, keys, client id and the user's own
properties) as one string, in the `properties` send header and inside stored records.
This module writes and reads it as MessageDecoder.messageProperties2String and
string2messageProperties (RocketMQ 4.9.8) do:

- writing: every entry as name, U+0001, value; entries joined by U+0002; no trailing
  separator; an empty map is the empty string.
- reading: split on U+0002; in each part the *first* U+0001 splits name from value, and
  a part is dropped unless both are non-empty (so a value may contain U+0001, a name may
  not); a later duplicate name overrides an earlier one. Nothing raises: what does not
  parse is skipped, as the Java reader skips it.

A name holding U+0001 or U+0002, or a value holding U+0002 or empty, cannot be carried:
the reader would split it differently. `representable` tells which entries survive a
round trip; `encode_properties` refuses the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: Separates a property's name from its value (MessageDecoder.NAME_VALUE_SEPARATOR).
NAME_VALUE_SEPARATOR = "\x01"
#: Separates one property from the next (MessageDecoder.PROPERTY_SEPARATOR).
PROPERTY_SEPARATOR = "\x02"
#: The longest properties string a stored record can carry: its length is a signed
#: 16-bit field (RocketMQ refuses longer ones with MESSAGE_ILLEGAL).
MAX_PROPERTIES_STRING_BYTES = 32767


def representable(name: str, value: str) -> bool:
    """True when the entry reads back unchanged from the properties string."""
    return (
        bool(name)
        and bool(value)
        and NAME_VALUE_SEPARATOR not in name
        and PROPERTY_SEPARATOR not in name
        and PROPERTY_SEPARATOR not in value
    )


def encode_properties(properties: Mapping[str, str] | Iterable[tuple[str, str]]) -> str:
    """The properties string of `properties`, in their iteration order.

    ValueError names the first entry the reader could not get back (see `representable`).
    """
    items = properties.items() if isinstance(properties, Mapping) else properties
    parts: list[str] = []
    for name, value in items:
        if not representable(name, value):
            raise ValueError(
                f"property {name!r}={value!r} cannot be carried: names must be non-empty "
                "without \\x01 or \\x02, values non-empty without \\x02"
            )
        parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}")
    return PROPERTY_SEPARATOR.join(parts)


def decode_properties(text: str) -> dict[str, str]:
    """The properties in a properties string, as RocketMQ reads them (never raises)."""
    out: dict[str, str] = {}
    for part in text.split(PROPERTY_SEPARATOR):
        name, separator, value = part.partition(NAME_VALUE_SEPARATOR)
        if separator and name and value:
            out[name] = value
    return out


def decode_properties_bytes(data: bytes | memoryview) -> dict[str, str]:
    """The properties in UTF-8 bytes; bad UTF-8 reads as U+FFFD, as Java's decoder does."""
    return decode_properties(bytes(data).decode("utf-8", "replace"))


__all__ = [
    "MAX_PROPERTIES_STRING_BYTES",
    "NAME_VALUE_SEPARATOR",
    "PROPERTY_SEPARATOR",
    "decode_properties",
    "decode_properties_bytes",
    "encode_properties",
    "representable",
]
