"""Who may do what: the ACL decision, RocketMQ 4.x's plain ACL semantics.

The order of the checks is PlainPermissionManager.validate's, then PlainPermissionChecker's:

1. a client address matching a global white address passes, with or without a key;
2. no key, or a key no account has: UNAUTHENTICATED;
3. a client address matching the account's whiteRemoteAddress passes (RocketMQ skips the
   signature and the permissions then: the white address is a way in, not a fence);
4. (the front checks the signature here, with secret_of);
5. publishing to RMQ_SYS_TRACE_TOPIC passes (message traces);
6. an admin account passes; an operation wanting ADMIN is refused to any other;
7. the resource's own permission if the account lists it, else the account's default for
   topics or for groups; a retry topic ``%RETRY%group`` is the group's resource.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from mockbroker.acl.permissions import Permission, grants, permission_word
from mockbroker.acl.rules import RETRY_PREFIX, Account, AclRules, retry_topic

# TopicValidator.RMQ_SYS_TRACE_TOPIC: RocketMQ lets any account publish its traces.
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"


class ResourceKind(Enum):
    """What a resource is."""

    TOPIC = "topic"
    GROUP = "group"
    BROKER = "broker"


@dataclass(frozen=True)
class Resource:
    """A topic or a consumer group a request touches."""

    kind: ResourceKind
    name: str

    @classmethod
    def topic(cls, name: str) -> Resource:
        """A topic; a retry topic (``%RETRY%group``) stands for its group, as in RocketMQ."""
        if name.startswith(RETRY_PREFIX):
            return cls(ResourceKind.GROUP, name[len(RETRY_PREFIX) :])
        return cls(ResourceKind.TOPIC, name)

    @classmethod
    def group(cls, name: str) -> Resource:
        """A consumer group."""
        return cls(ResourceKind.GROUP, name)

    @classmethod
    def broker(cls) -> Resource:
        """The broker itself, for admin operations that name no topic or group."""
        return cls(ResourceKind.BROKER, "")

    def __str__(self) -> str:
        if self.kind is ResourceKind.BROKER:
            return "the broker"
        return f"{self.kind.value} {self.name!r}"


class DenyReason(Enum):
    """Why a request was refused; the fronts map it to their status codes."""

    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission denied"


class AclDenied(Exception):
    """A request the ACL refuses; the message names the key, resource and permission."""

    def __init__(self, reason: DenyReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Acl:
    """The ACL decisions over one set of rules, which AclWatcher may replace while in use.

    Once an Acl is in place everything is denied unless the rules grant it.
    """

    def __init__(self, rules: AclRules) -> None:
        self._rules = rules

    @property
    def rules(self) -> AclRules:
        """The rules in force."""
        return self._rules

    def replace(self, rules: AclRules) -> None:
        """Put new rules in force; requests after this call see them."""
        self._rules = rules

    def is_globally_white(self, remote_address: str) -> bool:
        """Whether the client address matches one of globalWhiteRemoteAddresses."""
        return any(p.matches(remote_address) for p in self._rules.global_white_addresses)

    def signature_required(self, access_key: str | None, remote_address: str) -> bool:
        """Whether the front must check the request's signature before check().

        False for a global white address and for an address matching the account's own
        whiteRemoteAddress, where RocketMQ does not look at the signature. An unknown or
        missing key is True: check() refuses it anyway.
        """
        rules = self._rules
        if any(p.matches(remote_address) for p in rules.global_white_addresses):
            return False
        account = rules.accounts.get(access_key) if access_key is not None else None
        return account is None or not account.white_remote_address.matches(remote_address)

    def authenticate(self, access_key: str | None, remote_address: str) -> None:
        """Raise AclDenied (UNAUTHENTICATED) unless the address is white or the key known."""
        rules = self._rules
        if not any(p.matches(remote_address) for p in rules.global_white_addresses):
            self._account(rules, access_key)

    def secret_of(self, access_key: str) -> str:
        """The secret key of an account, to verify a signature; AclDenied if none has the key."""
        return self._account(self._rules, access_key).secret_key

    def check(
        self,
        access_key: str | None,
        remote_address: str,
        resource: Resource,
        wanted: Permission,
    ) -> None:
        """Raise AclDenied unless the account may have `wanted` on `resource`.

        The signature is the front's to check first (see signature_required). `wanted` is
        PUB, SUB, ANY (either) or ADMIN (an admin account only).
        """
        rules = self._rules
        if any(p.matches(remote_address) for p in rules.global_white_addresses):
            return
        account = self._account(rules, access_key)
        if account.white_remote_address.matches(remote_address):
            return
        if wanted == Permission.PUB and resource == Resource.topic(TRACE_TOPIC):
            return
        if account.admin:
            return
        if wanted & Permission.ADMIN:
            raise AclDenied(
                DenyReason.PERMISSION_DENIED,
                f"accessKey {account.access_key!r} is not an admin account;"
                f" ADMIN on {resource} is for admin accounts only",
            )
        owned, source = _owned(account, resource)
        if not grants(owned, wanted):
            raise AclDenied(
                DenyReason.PERMISSION_DENIED,
                f"accessKey {account.access_key!r} may not {permission_word(wanted)} {resource}"
                f" ({source} is {permission_word(owned)})",
            )

    @staticmethod
    def _account(rules: AclRules, access_key: str | None) -> Account:
        if access_key is None or not access_key:
            raise AclDenied(DenyReason.UNAUTHENTICATED, "the request carries no accessKey")
        account = rules.accounts.get(access_key)
        if account is None:
            raise AclDenied(DenyReason.UNAUTHENTICATED, f"no account has accessKey {access_key!r}")
        return account


def _owned(account: Account, resource: Resource) -> tuple[Permission, str]:
    key = retry_topic(resource.name) if resource.kind is ResourceKind.GROUP else resource.name
    owned = account.resource_perms.get(key)
    if owned is not None:
        return owned, "its permission"
    if resource.kind is ResourceKind.GROUP:
        return account.default_group_perm, "defaultGroupPerm"
    return account.default_topic_perm, "defaultTopicPerm"
