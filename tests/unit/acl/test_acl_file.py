from pathlib import Path

import pytest

from mockbroker.acl import AclFileError, Permission, load_acl_file, parse_acl_text

# RocketMQ 4.x's distribution/conf/plain_acl.yml, as shipped (licence header left out).
ROCKETMQ_SAMPLE = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
"""


def test_rocketmq_sample_parses() -> None:
    rules = parse_acl_text(ROCKETMQ_SAMPLE)
    assert [p.text for p in rules.global_white_addresses] == ["10.10.103.*", "192.168.0.*"]
    plain = rules.accounts["RocketMQ"]
    assert plain.secret_key == "12345678"
    assert not plain.admin
    assert plain.default_topic_perm == Permission.DENY
    assert plain.default_group_perm == Permission.SUB
    assert plain.resource_perms == {
        "topicA": Permission.DENY,
        "topicB": Permission.PUB | Permission.SUB,
        "topicC": Permission.SUB,
        "%RETRY%groupA": Permission.DENY,
        "%RETRY%groupB": Permission.PUB | Permission.SUB,
        "%RETRY%groupC": Permission.SUB,
    }
    assert not plain.white_remote_address.matches("127.0.0.1")
    admin = rules.accounts["rocketmq2"]
    assert admin.admin
    assert admin.white_remote_address.matches("192.168.1.20")
    # Absent defaults are DENY, as RocketMQ's parsePermFromString(null).
    assert admin.default_topic_perm == Permission.DENY


def test_secret_is_not_in_repr() -> None:
    rules = parse_acl_text(ROCKETMQ_SAMPLE)
    assert "12345678" not in repr(rules)


def test_data_version_written_by_rocketmq_is_accepted() -> None:
    text = ROCKETMQ_SAMPLE + "dataVersion:\n  - counter: 3\n    timestamp: 1700000000000\n"
    assert len(parse_acl_text(text).accounts) == 2


@pytest.mark.parametrize("text", ["", "# nothing\n", "accounts:\n", "accounts: []\n"])
def test_empty_files_have_no_accounts(text: str) -> None:
    rules = parse_acl_text(text)
    assert rules.accounts == {}
    assert rules.global_white_addresses == ()


GOOD_ACCOUNT = """\
accounts:
  - accessKey: producer1
    secretKey: secret123
"""


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (GOOD_ACCOUNT + "    topicPerms:\n      - orders=WRITE\n", 5, "unknown permission 'WRITE'"),
        (GOOD_ACCOUNT + "    groupPerms:\n      - g1=PUB | SUB\n", 5, "unknown permission"),
        (GOOD_ACCOUNT + "    defaultTopicPerm: READ\n", 4, "unknown permission 'READ'"),
        (GOOD_ACCOUNT + "    topicPerms:\n      - orders\n", 5, "is not NAME=PERMISSION"),
        (
            GOOD_ACCOUNT + "  - accessKey: producer1\n    secretKey: other1234\n",
            4,
            "accessKey 'producer1' appears twice",
        ),
        ("accounts:\n  - accessKey: producer1\n    secretKey: 123456\n", 3, "6 characters"),
        ("accounts:\n  - accessKey: short\n    secretKey: 1234567\n", 2, "accessKey 'short'"),
        ("accounts:\n  - accessKey: producer1\n", 2, "no secretKey"),
        (GOOD_ACCOUNT + "    whiteRemoteAddress: 192.168.1-5.7\n", 4, "192.168.1-5.7"),
        ("globalWhiteRemoteAddresses:\n  - 10.0.0.1\n  - 300.1.1.1\n", 3, "300.1.1.1"),
        ("globalWhiteRemoteAddress:\n  - 10.0.0.1\n", 1, "unknown key 'globalWhiteRemoteAddress'"),
        (GOOD_ACCOUNT + "    topicPerm:\n      - a=SUB\n", 4, "unknown account key 'topicPerm'"),
        (GOOD_ACCOUNT + "    admin: maybe\n", 4, "admin must be true or false"),
        (
            GOOD_ACCOUNT + "    topicPerms:\n      - a=SUB\n      - a=PUB\n",
            6,
            "given a permission twice",
        ),
        ("accounts: producer1\n", 1, "expected a list"),
        ("accounts:\n  - accessKey: [a\n", 3, "not valid YAML"),
    ],
)
def test_errors_name_their_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(AclFileError) as caught:
        parse_acl_text(text, "conf/plain_acl.yml")
    message = str(caught.value)
    assert message.startswith(f"conf/plain_acl.yml:{line}: "), message
    assert fragment in message
    assert caught.value.line == line


def test_short_secret_error_does_not_show_the_secret() -> None:
    with pytest.raises(AclFileError) as caught:
        parse_acl_text("accounts:\n  - accessKey: producer1\n    secretKey: s3cr3t\n")
    assert "s3cr3t" not in str(caught.value)


def test_load_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ROCKETMQ_SAMPLE)
    assert set(load_acl_file(path).accounts) == {"RocketMQ", "rocketmq2"}
    path.write_text("accounts:\n  - accessKey: x\n")
    with pytest.raises(AclFileError, match=rf"^{path}:2: "):
        load_acl_file(path)
