import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mockbroker.acl import address_matches, parse_address_pattern

MATCHES = [
    ("*", "10.1.2.3", True),
    ("*.*.*.*", "::1", True),
    ("*:*:*:*:*:*:*:*", "10.1.2.3", True),
    ("", "10.1.2.3", False),
    (None, "10.1.2.3", False),
    ("127.0.0.1", "127.0.0.1", True),
    ("127.0.0.1", "127.0.0.2", False),
    ("127.0.0.1,127.0.0.2,127.0.0.3", "127.0.0.2", True),
    ("127.0.0.1,127.0.0.2,127.0.0.3", "127.0.0.4", False),
    ("127.0.0.{1,2,3}", "127.0.0.3", True),
    ("127.0.0.{1,2,3}", "127.0.0.0", False),
    ("192.168.1.*", "192.168.1.255", True),
    ("192.168.1.*", "192.168.2.1", False),
    ("127.0.0.1-200", "127.0.0.200", True),
    ("127.0.0.1-200", "127.0.0.201", False),
    ("127.0.0.1-200", "127.0.0.0", False),
    ("127.0.1-200.*", "127.0.150.9", True),
    ("127.0.1-200.*", "127.0.201.9", False),
    ("192.100-150.*.*", "192.130.0.2", True),
    ("127.*.*.*", "127.9.9.9", True),
    ("127.*.*.*", "128.0.0.1", False),
    ("192.168.1.*", "::ffff:192.168.1.7", True),
    ("192.168.1.*", "not an address", False),
    ("192.168.1.*", "::1", False),
    ("::1", "0000:0000:0000:0000:0000:0000:0000:0001", True),
    ("::1", "::2", False),
    ("1050:0000:0000:0000:0005:0600:300c:326b", "1050::5:600:300c:326b", True),
    ("1050::0005:0600:300c:1,1050::0005:0600:300c:2", "1050:0:0:0:5:600:300c:2", True),
    ("1050::0005:0600:300c:{1,2,3}", "1050:0:0:0:5:600:300c:3", True),
    ("1050::0005:0600:300c:{1,2,3}", "1050:0:0:0:5:600:300c:4", False),
    ("1050::0005:0600:300c:*", "1050::5:600:300c:ffff", True),
    ("1050::0005:0600:300c:*", "1050::5:600:3001:1", False),
    ("1050::0005:0600:300c:1-200", "1050::5:600:300c:1ff", True),
    ("1050::0005:0600:300c:1-200", "1050::5:600:300c:201", False),
    ("1050::0005:0600:1-200:*", "1050::5:600:150:9", True),
    ("1050::0005:0600:1-200:*", "1050::5:600:201:9", False),
    ("1050:0005:0600:300c:3261:*", "1050:5:600:300c:3261:1:2:3", True),
    ("1050::*", "1050::1", True),
    ("192.168.1.1", "192.168.1.1 ", True),
]


@pytest.mark.parametrize(("pattern", "address", "expected"), MATCHES)
def test_patterns(pattern: str | None, address: str, expected: bool) -> None:
    assert address_matches(pattern, address) is expected


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        ("256.0.0.1", "'256.0.0.1'"),
        ("::1ggg", "'::1ggg'"),
        ("127.0.0.1,2,3", "'2'"),
        ("127.0.0.1,2,3}", "braces"),
        ("{192.168.1.1}", "braces"),
        ("192.168.{1,2}.*", "braces"),
        ("192.168.{1}", "not an IP address"),
        ("192.*", "4 parts"),
        ("192.168.1-5.7", "every part after"),
        ("192.168.1.5-1", "ends before it starts"),
        ("192.168.1.-5", "is not a decimal number"),
        ("192.168.1.1-300", "above 255"),
        ("1050::5:600:300c:1-10000", "hexadecimal number from 0 to ffff"),
        ("1:2:3:4:5:6:7:8:*", "more than 8 parts"),
        ("1::2::*", "'::' appears twice"),
        ("10.0.0.x*", "neither '*' nor a range"),
    ],
)
def test_malformed_patterns_say_what_is_wrong(pattern: str, fragment: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_address_pattern(pattern)
    assert fragment in str(caught.value)
    assert pattern in str(caught.value) or fragment.strip("'") in pattern


ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).filter(lambda a: a.ipv4_mapped is None).map(str)


@st.composite
def pattern_for(draw: st.DrawFn, address: str) -> str:
    ip = ipaddress.ip_address(address)
    if ip.version == 4:
        parts = [str(b) for b in ip.packed]
        sep, top, fmt = ".", 255, str
    else:
        parts = ip.exploded.split(":")
        sep, top, fmt = ":", 0xFFFF, lambda n: format(n, "x")
    form = draw(st.sampled_from(["exact", "list", "braces", "wild", "range", "compressed"]))
    if form == "exact":
        return address
    if form == "compressed" and ip.version == 6:
        return ip.exploded
    if form == "list":
        others = draw(st.lists(ipv4 if ip.version == 4 else ipv6, max_size=3))
        items = [*others, address]
        return ",".join(draw(st.permutations(items)))
    if form == "braces":
        last = parts[-1] if ip.version == 4 else format(int(parts[-1], 16), "x")
        extra = draw(st.lists(st.integers(0, top).map(fmt), max_size=3))
        return sep.join(parts[:-1]) + sep + "{" + ",".join([*extra, last]) + "}"
    k = draw(st.integers(1 if ip.version == 4 else 0, len(parts) - 1))
    value = int(parts[k], 10 if ip.version == 4 else 16)
    if form == "range":
        lo = draw(st.integers(0, value))
        hi = draw(st.integers(value, top))
        middle = f"{fmt(lo)}-{fmt(hi)}"
    else:
        middle = "*"
    return sep.join([*parts[:k], middle, *["*"] * (len(parts) - k - 1)])


@given(st.one_of(ipv4, ipv6).flatmap(lambda a: st.tuples(st.just(a), pattern_for(a))))
def test_a_pattern_built_from_an_address_matches_it(case: tuple[str, str]) -> None:
    address, pattern = case
    assert parse_address_pattern(pattern).matches(address), (pattern, address)
