"""Permission bits of RocketMQ 4.x's plain ACL, and how an owned permission grants a wanted one."""

from __future__ import annotations

from enum import IntFlag


class Permission(IntFlag):
    """What an account may do with a topic or a group.

    DENY, ANY, PUB and SUB have RocketMQ's values (acl/common/Permission.java). ADMIN is
    ordermq's: it is never written in a file, an operation wants it when only an admin
    account may run it.
    """

    NONE = 0
    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8
    ADMIN = 16


# The words plain_acl.yml accepts (AclConstants.java); RocketMQ writes "PUB|SUB".
_WORDS = {
    "DENY": Permission.DENY,
    "PUB": Permission.PUB,
    "SUB": Permission.SUB,
    "PUB|SUB": Permission.PUB | Permission.SUB,
    "SUB|PUB": Permission.PUB | Permission.SUB,
}


def parse_permission(word: str) -> Permission:
    """The permission a plain_acl.yml word names; ValueError naming the word if unknown."""
    try:
        return _WORDS[word.strip()]
    except KeyError:
        raise ValueError(
            f"unknown permission {word!r}: expected one of DENY, PUB, SUB, PUB|SUB, SUB|PUB"
        ) from None


def permission_word(permission: Permission) -> str:
    """The word for a permission, for messages: PUB, SUB, PUB|SUB, DENY, ANY or ADMIN."""
    if permission == Permission.PUB | Permission.SUB:
        return "PUB|SUB"
    return permission.name or "NONE"


def grants(owned: Permission, wanted: Permission) -> bool:
    """Whether `owned` allows `wanted` (RocketMQ's Permission.checkPermission).

    DENY in `owned` refuses everything; ANY is satisfied by PUB or SUB; otherwise one
    shared bit is enough. ADMIN is decided by the account's admin flag, never here.
    """
    if owned & Permission.DENY:
        return False
    if wanted & Permission.ANY:
        return bool(owned & (Permission.PUB | Permission.SUB))
    return bool(wanted & owned & (Permission.PUB | Permission.SUB))
