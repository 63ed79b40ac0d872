import pytest

from mockbroker.acl import (
    ORDERMQ_RPCS,
    REQUEST_CODES,
    V2_RPCS,
    Acl,
    AclDenied,
    AclRules,
    DenyReason,
    Needs,
    Permission,
    Resource,
    authorize,
    parse_acl_text,
    wanted,
)
from sdk._remoting.codes import RequestCode

RULES = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: pubonly1
    secretKey: pubsecret1
    topicPerms:
      - orders=PUB
    groupPerms:
      - g1=SUB
  - accessKey: subonly1
    secretKey: subsecret1
    topicPerms:
      - orders=SUB
    groupPerms:
      - g1=SUB
      - g2=DENY
  - accessKey: defaults1
    secretKey: defsecret1
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
    topicPerms:
      - hidden=DENY
  - accessKey: nodefault
    secretKey: nodsecret1
    topicPerms:
      - orders=PUB|SUB
  - accessKey: whitelisted
    secretKey: whitesecret
    whiteRemoteAddress: 192.168.5.*
  - accessKey: admin0001
    secretKey: adminsecret
    admin: true
"""

HERE = "172.16.0.9"
T = Resource.topic
G = Resource.group
PUB, SUB, ANY, ADMIN = Permission.PUB, Permission.SUB, Permission.ANY, Permission.ADMIN
OK = None
UNAUTH = DenyReason.UNAUTHENTICATED
DENIED = DenyReason.PERMISSION_DENIED


@pytest.fixture
def acl() -> Acl:
    return Acl(parse_acl_text(RULES))


MATRIX = [
    # who, from, resource, wanted, outcome
    ("nobody1", HERE, T("orders"), PUB, UNAUTH),
    (None, HERE, T("orders"), PUB, UNAUTH),
    ("", HERE, T("orders"), SUB, UNAUTH),
    (None, "10.10.103.7", T("orders"), PUB, OK),
    ("nobody1", "10.10.103.7", T("anything"), SUB, OK),
    ("nodefault", "10.10.103.7", T("orders"), ADMIN, OK),
    ("pubonly1", HERE, T("orders"), PUB, OK),
    ("pubonly1", HERE, T("orders"), SUB, DENIED),
    ("pubonly1", HERE, G("g1"), SUB, OK),
    ("pubonly1", HERE, T("payments"), PUB, DENIED),
    ("subonly1", HERE, T("orders"), PUB, DENIED),
    ("subonly1", HERE, T("orders"), SUB, OK),
    ("subonly1", HERE, G("g1"), SUB, OK),
    ("subonly1", HERE, G("g2"), SUB, DENIED),
    ("subonly1", HERE, G("g3"), SUB, DENIED),
    ("defaults1", HERE, T("anything"), PUB, OK),
    ("defaults1", HERE, T("anything"), SUB, OK),
    ("defaults1", HERE, T("hidden"), SUB, DENIED),
    ("defaults1", HERE, T("hidden"), ANY, DENIED),
    ("defaults1", HERE, G("anygroup"), SUB, OK),
    ("defaults1", HERE, G("anygroup"), PUB, DENIED),
    ("nodefault", HERE, T("orders"), SUB, OK),
    ("nodefault", HERE, T("other"), SUB, DENIED),
    ("nodefault", HERE, G("g1"), SUB, DENIED),
    ("subonly1", HERE, T("%RETRY%g1"), SUB, OK),
    ("subonly1", HERE, T("%RETRY%g2"), SUB, DENIED),
    ("defaults1", HERE, T("%RETRY%anygroup"), SUB, OK),
    ("pubonly1", HERE, T("orders"), ANY, OK),
    ("subonly1", HERE, T("orders"), ANY, OK),
    ("nodefault", HERE, T("other"), ANY, DENIED),
    ("nodefault", HERE, T("RMQ_SYS_TRACE_TOPIC"), PUB, OK),
    ("nodefault", HERE, T("RMQ_SYS_TRACE_TOPIC"), SUB, DENIED),
    ("whitelisted", "192.168.5.9", T("orders"), PUB, OK),
    ("whitelisted", "192.168.5.9", T("orders"), ADMIN, OK),
    ("whitelisted", "192.168.6.9", T("orders"), PUB, DENIED),
    ("admin0001", HERE, T("anything"), PUB, OK),
    ("admin0001", HERE, G("anygroup"), SUB, OK),
    ("admin0001", HERE, Resource.broker(), ADMIN, OK),
    ("pubonly1", HERE, Resource.broker(), ADMIN, DENIED),
    ("defaults1", HERE, T("orders"), ADMIN, DENIED),
]


@pytest.mark.parametrize(("key", "address", "resource", "perm", "outcome"), MATRIX)
def test_decision_matrix(
    acl: Acl,
    key: str | None,
    address: str,
    resource: Resource,
    perm: Permission,
    outcome: DenyReason | None,
) -> None:
    if outcome is None:
        acl.check(key, address, resource, perm)
        return
    with pytest.raises(AclDenied) as caught:
        acl.check(key, address, resource, perm)
    assert caught.value.reason is outcome
    message = str(caught.value)
    assert "secret" not in message
    if outcome is DENIED:
        assert resource.name in message
        assert (perm.name or "") in message


def test_denial_names_the_resource_and_permission(acl: Acl) -> None:
    with pytest.raises(AclDenied) as caught:
        acl.check("subonly1", HERE, T("%RETRY%g2"), SUB)
    assert str(caught.value) == (
        "accessKey 'subonly1' may not SUB group 'g2' (its permission is DENY)"
    )
    with pytest.raises(AclDenied) as caught:
        acl.check("nodefault", HERE, T("other"), PUB)
    assert "defaultTopicPerm is DENY" in str(caught.value)


def test_secret_of(acl: Acl) -> None:
    assert acl.secret_of("pubonly1") == "pubsecret1"
    with pytest.raises(AclDenied) as caught:
        acl.secret_of("nobody1")
    assert caught.value.reason is UNAUTH


def test_signature_required(acl: Acl) -> None:
    assert not acl.signature_required(None, "10.10.103.1")
    assert not acl.signature_required("whitelisted", "192.168.5.1")
    assert acl.signature_required("whitelisted", "192.168.6.1")
    assert acl.signature_required("pubonly1", HERE)
    assert acl.signature_required("nobody1", HERE)


def test_no_rules_deny_everything() -> None:
    acl = Acl(AclRules())
    with pytest.raises(AclDenied):
        acl.check("pubonly1", HERE, T("orders"), PUB)


def test_operations_need_what_rocketmq_says(acl: Acl) -> None:
    pull = REQUEST_CODES[RequestCode.PULL_MESSAGE]
    authorize(acl, "subonly1", HERE, pull, topic="orders", group="g1")
    with pytest.raises(AclDenied):
        authorize(acl, "pubonly1", HERE, pull, topic="orders", group="g1")
    with pytest.raises(AclDenied):
        authorize(acl, "subonly1", HERE, pull, topic="orders", group="g2")
    send = ORDERMQ_RPCS["Send"]
    authorize(acl, "pubonly1", HERE, send, topic="orders")
    # Sending to a retry topic (a send-back) wants SUB on the group, as in RocketMQ.
    assert wanted(send, topic="%RETRY%g1") == [(G("g1"), SUB)]
    authorize(acl, "pubonly1", HERE, send, topic="%RETRY%g1")
    with pytest.raises(AclDenied):
        authorize(acl, "nodefault", HERE, send, topic="%RETRY%g1")
    for name in ("LockBatch", "Pull", "Receive", "Ack", "CommitConsumerOffsets"):
        assert ORDERMQ_RPCS[name] == Needs(topic=SUB, group=SUB)
    assert V2_RPCS["ReceiveMessage"] == Needs(topic=SUB, group=SUB)
    assert V2_RPCS["SendMessage"] == Needs(topic=PUB)


def test_admin_operations(acl: Acl) -> None:
    create = REQUEST_CODES[17]  # UPDATE_AND_CREATE_TOPIC
    authorize(acl, "admin0001", HERE, create, topic="new")
    with pytest.raises(AclDenied) as caught:
        authorize(acl, "defaults1", HERE, create, topic="new")
    assert caught.value.reason is DENIED
    with pytest.raises(AclDenied) as caught:
        authorize(acl, "defaults1", HERE, ORDERMQ_RPCS["ResetOffset"], group="g1")
    assert "not an admin" in str(caught.value)
    authorize(acl, "admin0001", HERE, ORDERMQ_RPCS["ResetOffset"])


def test_operations_without_resources_need_a_known_account(acl: Acl) -> None:
    authorize(acl, "nodefault", HERE, ORDERMQ_RPCS["ListTopics"])
    authorize(acl, None, "10.10.103.2", REQUEST_CODES.get(105, Needs()))
    with pytest.raises(AclDenied) as caught:
        authorize(acl, "nobody1", HERE, ORDERMQ_RPCS["BrokerStatus"])
    assert caught.value.reason is UNAUTH


def test_a_missing_resource_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="topic"):
        wanted(ORDERMQ_RPCS["Pull"], group="g1")
    with pytest.raises(ValueError, match="group"):
        wanted(ORDERMQ_RPCS["Pull"], topic="orders")
