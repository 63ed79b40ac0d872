"""Accounts and permissions: RocketMQ 4.x's plain ACL (plain_acl.yml), in the broker core.

What is here: the file format and its checks (acl_file), client address patterns
(addresses), the decision of who may do what (decisions), the permission each operation of
each front needs (operations), and reloading the file when it changes (watcher).

Wired into ordermq's gRPC and admin service (mockbroker/fronts/grpc/auth.py) and the
RocketMQ remoting broker port (mockbroker/fronts/remoting/auth.py) and RocketMQ 5's gRPC
front (mockbroker/fronts/v2/auth.py) when the broker has `--acl-file`; without it the
broker serves everyone, as before. The remoting name server is open, as RocketMQ's.
"""

from mockbroker.acl.acl_file import KEY_MIN_LENGTH, AclFileError, load_acl_file, parse_acl_text
from mockbroker.acl.addresses import AddressPattern, address_matches, parse_address_pattern
from mockbroker.acl.decisions import Acl, AclDenied, DenyReason, Resource, ResourceKind
from mockbroker.acl.operations import (
    ORDERMQ_RPCS,
    REQUEST_CODES,
    V2_RPCS,
    Needs,
    authorize,
    wanted,
)
from mockbroker.acl.permissions import Permission, grants, parse_permission
from mockbroker.acl.rules import Account, AclRules
from mockbroker.acl.watcher import AclWatcher

__all__ = [
    "KEY_MIN_LENGTH",
    "ORDERMQ_RPCS",
    "REQUEST_CODES",
    "V2_RPCS",
    "Account",
    "Acl",
    "AclDenied",
    "AclFileError",
    "AclRules",
    "AclWatcher",
    "AddressPattern",
    "DenyReason",
    "Needs",
    "Permission",
    "Resource",
    "ResourceKind",
    "address_matches",
    "authorize",
    "grants",
    "load_acl_file",
    "parse_acl_text",
    "parse_address_pattern",
    "parse_permission",
    "wanted",
]
