"""Client address patterns as RocketMQ 4.x's plain ACL accepts them.

The forms (RemoteAddressStrategyFactory.java, AclUtils.java):

- blank: matches no address; ``*``, ``*.*.*.*`` and ``*:*:*:*:*:*:*:*``: match every one;
- one address, IPv4 or IPv6 (``::`` shortening allowed): that address;
- a comma list of whole addresses, ``192.168.1.1,192.168.1.2``: any of them;
- braces in the last part, ``192.168.1.{1,2,3}`` or ``1050::5:600:300c:{1,2}``: the prefix
  followed by each item;
- ``*`` or a range ``a-b`` (decimal for IPv4, hexadecimal for IPv6) in one part, and ``*`` in
  every part after it: ``192.168.1.*``, ``192.168.1.1-100``, ``10.1-20.*.*``,
  ``1050::5:600:300c:*``, ``1050::5:600:300c:1-ff``, ``1050::5:600:1-20:*``.

Where RocketMQ silently ignores what follows the first wildcard or range
(``192.168.1-5.7`` means ``192.168.1-5.*`` there), ordermq refuses the pattern: it does not
mean what it says. Braces elsewhere than in the last part are refused as RocketMQ refuses
them. A client's IPv4-mapped IPv6 address (``::ffff:10.0.0.1``) matches as its IPv4 one.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class _Span:
    """Addresses of one family whose first parts are `prefix` and next part is in lo..hi."""

    version: int
    prefix: tuple[int, ...]
    lo: int
    hi: int

    def matches(self, parts: tuple[int, ...]) -> bool:
        n = len(self.prefix)
        return parts[:n] == self.prefix and self.lo <= parts[n] <= self.hi


@dataclass(frozen=True)
class AddressPattern:
    """A parsed address pattern; `text` is what the file said."""

    text: str
    match_all: bool = False
    exact: frozenset[_Address] = field(default_factory=frozenset)
    spans: tuple[_Span, ...] = ()

    def matches(self, address: str) -> bool:
        """Whether the client address (a bare host, no port) is one the pattern names."""
        if self.match_all:
            return True
        client = _client_address(address)
        if client is None:
            return False
        if client in self.exact:
            return True
        parts = _parts(client)
        return any(s.version == client.version and s.matches(parts) for s in self.spans)


def parse_address_pattern(text: str | None) -> AddressPattern:
    """Parse a whiteRemoteAddress or globalWhiteRemoteAddresses entry.

    Raises ValueError saying what is wrong with the pattern.
    """
    if text is None or not text.strip():
        return AddressPattern(text or "")
    text = text.strip()
    if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return AddressPattern(text, match_all=True)
    if text.endswith("}") or "{" in text:
        return AddressPattern(text, exact=_braces(text))
    if "," in text:
        return AddressPattern(text, exact=frozenset(_address(a, text) for a in text.split(",")))
    if "*" in text or "-" in text:
        span = _ipv6_span(text) if ":" in text else _ipv4_span(text)
        return AddressPattern(text, spans=(span,))
    return AddressPattern(text, exact=frozenset({_address(text, text)}))


def address_matches(pattern: str | None, address: str) -> bool:
    """Whether `address` matches the pattern text (ValueError if the pattern is malformed)."""
    return parse_address_pattern(pattern).matches(address)


def _client_address(address: str) -> _Address | None:
    try:
        client = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(client, ipaddress.IPv6Address) and client.ipv4_mapped is not None:
        return client.ipv4_mapped
    return client


def _parts(address: _Address) -> tuple[int, ...]:
    if isinstance(address, ipaddress.IPv4Address):
        return tuple(address.packed)
    packed = address.packed
    return tuple(int.from_bytes(packed[i : i + 2], "big") for i in range(0, 16, 2))


def _address(text: str, pattern: str) -> _Address:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        raise ValueError(
            f"{text.strip()!r} in address pattern {pattern!r} is not an IP address"
        ) from None


def _braces(text: str) -> frozenset[_Address]:
    start = text.find("{")
    head = text[:start]
    if (
        start < 0
        or not text.endswith("}")
        or "{" in text[start + 1 :]
        or not head
        or head[-1] not in ".:"
    ):
        raise ValueError(
            f"address pattern {text!r}: braces may only list the last part, as in 192.168.1.{{1,2}}"
        )
    items = text[start + 1 : -1].split(",")
    return frozenset(_address(head + item.strip(), text) for item in items)


def _number(text: str, base: int, top: int, pattern: str) -> int:
    kind, top_text = ("decimal", str(top)) if base == 10 else ("hexadecimal", format(top, "x"))
    digits = "0123456789" if base == 10 else "0123456789abcdefABCDEF"
    if not text or len(text) > len(top_text) or any(c not in digits for c in text):
        raise ValueError(
            f"address pattern {pattern!r}: {text!r} is not a {kind} number from 0 to {top_text}"
        )
    value = int(text, base)
    if value > top:
        raise ValueError(f"address pattern {pattern!r}: {text!r} is above {top_text}")
    return value


def _range(part: str, base: int, top: int, pattern: str) -> tuple[int, int]:
    if part == "*":
        return 0, top
    lo_text, sep, hi_text = part.partition("-")
    if not sep:
        raise ValueError(f"address pattern {pattern!r}: {part!r} is neither '*' nor a range a-b")
    lo, hi = _number(lo_text, base, top, pattern), _number(hi_text, base, top, pattern)
    if lo > hi:
        raise ValueError(f"address pattern {pattern!r}: range {part!r} ends before it starts")
    return lo, hi


def _wild_index(parts: list[str], pattern: str) -> int:
    k = next(i for i, p in enumerate(parts) if "*" in p or "-" in p)
    if any(p != "*" for p in parts[k + 1 :]):
        raise ValueError(
            f"address pattern {pattern!r}: every part after the first '*' or range must be '*'"
        )
    return k


def _ipv4_span(text: str) -> _Span:
    parts = text.split(".")
    if len(parts) != 4:
        raise ValueError(f"address pattern {text!r}: an IPv4 pattern has 4 parts")
    k = _wild_index(parts, text)
    prefix = tuple(_number(p, 10, 255, text) for p in parts[:k])
    lo, hi = _range(parts[k], 10, 255, text)
    return _Span(4, prefix, lo, hi)


def _ipv6_span(text: str) -> _Span:
    parts = text.split(":")
    k = _wild_index(parts, text)
    wild_len = len(":".join(parts[k:]))
    head = text[: len(text) - wild_len]  # "...:" before the wildcard, or "...::"
    head = head[:-1] if head.endswith(":") and not head.endswith("::") else head
    room = 8 - (len(parts) - k)
    if "::" in head:
        left, _, right = head.partition("::")
        if "::" in right:
            raise ValueError(f"address pattern {text!r}: '::' appears twice")
        lgroups = left.split(":") if left else []
        rgroups = right.split(":") if right else []
        zeros = room - len(lgroups) - len(rgroups)
        if zeros < 1:
            raise ValueError(f"address pattern {text!r}: more than 8 parts")
        groups = [*lgroups, *["0"] * zeros, *rgroups]
    else:
        groups = head.split(":") if head else []
        if len(groups) > room:
            raise ValueError(f"address pattern {text!r}: more than 8 parts")
    prefix = tuple(_number(g, 16, 0xFFFF, text) for g in groups)
    lo, hi = _range(parts[k], 16, 0xFFFF, text)
    return _Span(6, prefix, lo, hi)
