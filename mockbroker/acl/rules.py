"""The rules of one plain_acl.yml: accounts and global white addresses, as loaded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mockbroker.acl.addresses import AddressPattern
from mockbroker.acl.permissions import Permission

# RocketMQ keeps a group's permission under its retry topic's name (MixAll.getRetryTopic).
RETRY_PREFIX = "%RETRY%"


def retry_topic(group: str) -> str:
    """The retry topic of `group`, the key its permission is kept under."""
    return RETRY_PREFIX + group


@dataclass(frozen=True)
class Account:
    """One entry of `accounts`; the secret is left out of repr so logs never show it."""

    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: AddressPattern
    admin: bool
    default_topic_perm: Permission
    default_group_perm: Permission
    # Topics under their name, groups under their retry topic's name, as RocketMQ keeps them.
    resource_perms: Mapping[str, Permission]


@dataclass(frozen=True)
class AclRules:
    """Everything one ACL file says."""

    global_white_addresses: tuple[AddressPattern, ...] = ()
    accounts: Mapping[str, Account] = field(default_factory=dict)
