"""offsetMsgId and UNIQ_KEY, as MessageDecoder and MessageClientIDSetter build them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from sdk._remoting.message_ids import (
    SocketAddress,
    UniqKeyGenerator,
    create_offset_msg_id,
    create_uniq_key,
    decode_offset_msg_id,
    decode_uniq_key,
    month_start_ms,
    uniq_key_time_ms,
)
from sdk.testing import FakeClock


def ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)


def test_offset_msg_id_of_an_ipv4_store_host() -> None:
    host = SocketAddress.parse("127.0.0.1:9103")
    msg_id = create_offset_msg_id(host, 123456)
    assert msg_id == "7F0000010000238F000000000001E240"
    assert decode_offset_msg_id(msg_id) == (host, 123456)
    assert decode_offset_msg_id(msg_id.lower()) == (host, 123456)


def test_offset_msg_id_decodes_host_port_and_a_large_offset() -> None:
    host, offset = decode_offset_msg_id("645100FA00002A9F000000489A3AA09E")
    assert (str(host), offset) == ("100.81.0.250:10911", 311825178782)


def test_offset_msg_id_of_an_ipv6_store_host_is_56_digits() -> None:
    host = SocketAddress.parse("[2001:db8::7]:10911")
    msg_id = create_offset_msg_id(host, 2**40 + 5)
    assert len(msg_id) == 56 and msg_id == msg_id.upper()
    assert msg_id.startswith("20010DB8000000000000000000000007" + "00002A9F")
    assert decode_offset_msg_id(msg_id) == (host, 2**40 + 5)


@pytest.mark.parametrize("bad", ["", "7F00", "7F0000010000238F000000000001E24", "Z" * 32, "0" * 40])
def test_a_string_that_is_no_offset_msg_id_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="offsetMsgId"):
        decode_offset_msg_id(bad)


def test_socket_addresses_parse_and_print() -> None:
    assert SocketAddress.parse("10.0.0.1:80") == SocketAddress(bytes([10, 0, 0, 1]), 80)
    assert str(SocketAddress.parse("::1:5")) == "[::1]:5"
    assert SocketAddress.parse("[::1]:5").is_v6
    # A v4 client on a dual-stack socket is reported as the v4 address.
    assert SocketAddress.parse("[::ffff:10.0.0.1]:80") == SocketAddress.parse("10.0.0.1:80")
    assert SocketAddress.parse("1.2.3.4:7").packed() == bytes([1, 2, 3, 4, 0, 0, 0, 7])
    for bad in ("localhost:80", "1.2.3.4", "1.2.3.4:x", ""):
        with pytest.raises(ValueError):
            SocketAddress.parse(bad)
    with pytest.raises(ValueError, match="4 or 16 bytes"):
        SocketAddress(b"\x01", 1)


def test_uniq_key_layout_ip_pid_loader_hash_time_diff_counter() -> None:
    key = create_uniq_key(bytes([127, 0, 0, 1]), 0x0FA0, 0x1B6D3586, 0x0ABCDEF0, 1)
    assert key == "7F0000010FA01B6D35860ABCDEF00001"
    parts = decode_uniq_key(key)
    assert (parts.ip, parts.pid, parts.class_loader_hash, parts.time_diff_ms, parts.counter) == (
        bytes([127, 0, 0, 1]), 0x0FA0, 0x1B6D3586, 0x0ABCDEF0, 1,
    )  # fmt: skip
    assert str(parts) == key


def test_uniq_key_keeps_the_low_bits_as_java_casts_do() -> None:
    key = create_uniq_key(bytes(4), 0x12345, -1, -2, 0x10002)
    assert key == "00000000" + "2345" + "FFFFFFFF" + "FFFFFFFE" + "0002"
    parts = decode_uniq_key(key)
    assert (parts.pid, parts.class_loader_hash, parts.time_diff_ms, parts.counter) == (
        0x2345, -1, -2, 2,
    )  # fmt: skip


def test_an_ipv6_uniq_key_is_56_digits_and_a_go_key_decodes_in_lower_case() -> None:
    ip6 = bytes(15) + b"\x01"
    key = create_uniq_key(ip6, 1, 2, 3, 4)
    assert len(key) == 56 and decode_uniq_key(key).ip == ip6
    go_style = "7F0000010FA000000000" + "0abcdef00001"
    assert decode_uniq_key(go_style).time_diff_ms == 0x0ABCDEF0
    for foreign in ("AC1100020001", "not-a-key", "G" * 32):
        with pytest.raises(ValueError, match="UNIQ_KEY"):
            decode_uniq_key(foreign)


def test_generated_keys_count_up_and_carry_ip_pid_and_time() -> None:
    clock = FakeClock(ms(2026, 3, 15, 12, 0, 0) / 1000)
    gen = UniqKeyGenerator(bytes([10, 1, 2, 3]), clock, pid=0x12345, class_loader_hash=7, tz=UTC)
    first, second = gen.next(), gen.next()
    assert int(second[-4:], 16) - int(first[-4:], 16) == 1
    parts = decode_uniq_key(first)
    assert (parts.ip, parts.pid, parts.class_loader_hash) == (bytes([10, 1, 2, 3]), 0x2345, 7)
    assert parts.time_diff_ms == ms(2026, 3, 15, 12) - ms(2026, 3, 1)
    assert uniq_key_time_ms(first, ms(2026, 3, 15, 12, 0, 5), UTC) == ms(2026, 3, 15, 12)


def test_the_counter_wraps_at_16_bits() -> None:
    gen = UniqKeyGenerator(bytes(4), FakeClock(), tz=UTC)
    keys = [gen.next() for _ in range(65537)]
    assert (keys[0][-4:], keys[65535][-4:], keys[65536][-4:]) == ("0000", "FFFF", "0000")


def test_the_time_difference_restarts_with_each_month() -> None:
    clock = FakeClock(ms(2026, 1, 31, 23, 59, 59) / 1000)
    gen = UniqKeyGenerator(bytes(4), clock, tz=UTC)
    # Past 24.8 days the difference overflows Java's int; readers take it unsigned.
    late = decode_uniq_key(gen.next()).time_diff_ms
    assert late < 0 and late & 0xFFFF_FFFF == ms(2026, 1, 31, 23, 59, 59) - ms(2026, 1, 1)
    clock.advance(2)
    assert decode_uniq_key(gen.next()).time_diff_ms == 1000
    clock.advance(29 * 86400)  # into March: February had 28 days
    assert decode_uniq_key(gen.next()).time_diff_ms == ms(2026, 3, 2, 0, 0, 1) - ms(2026, 3, 1)


def test_a_clock_stepped_back_a_little_gives_zero_not_a_negative_difference() -> None:
    clock = FakeClock(ms(2026, 5, 1, 0, 0, 0) / 1000 + 0.010)
    gen = UniqKeyGenerator(bytes(4), clock, tz=UTC)
    clock.step_wall_clock(-0.5)  # NTP steps the clock back to before the month began
    assert decode_uniq_key(gen.next()).time_diff_ms == 0
    clock.step_wall_clock(-2000)  # far back: Java keeps the negative difference
    assert decode_uniq_key(gen.next()).time_diff_ms == -2000 * 1000 + 10 - 500


def test_a_key_from_late_last_month_reads_as_last_month() -> None:
    late_january = ms(2026, 1, 31, 22, 0, 0)
    gen = UniqKeyGenerator(bytes(4), FakeClock(late_january / 1000), tz=UTC)
    key = gen.next()
    assert uniq_key_time_ms(key, ms(2026, 2, 1, 1, 0, 0), UTC) == late_january


def test_month_start_in_a_zone_ahead_of_utc() -> None:
    plus9 = timezone(timedelta(hours=9))
    # 2026-03-31 20:00 UTC is already April 1st in UTC+9.
    assert month_start_ms(ms(2026, 3, 31, 20), plus9) == ms(2026, 3, 31, 15)
