"""Reading RocketMQ 4.x's plain_acl.yml into AclRules, with errors that name the line.

The file is composed into YAML nodes (which keep their position) rather than loaded into
plain values, so that every fault is reported as ``FILE:LINE: what is wrong``. Checks
beyond RocketMQ's own loader: unknown keys, unknown permission words and malformed
address patterns are errors rather than silently DENY or a failure at the first request.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from mockbroker.acl.addresses import AddressPattern, parse_address_pattern
from mockbroker.acl.permissions import Permission, parse_permission
from mockbroker.acl.rules import Account, AclRules, retry_topic

# AclConstants.ACCESS_KEY_MIN_LENGTH / SECRET_KEY_MIN_LENGTH are 6, and
# PlainPermissionManager.checkPlainAccessConfig refuses a length <= 6: 7 is the minimum.
KEY_MIN_LENGTH = 7

_TOP_KEYS = frozenset({"globalWhiteRemoteAddresses", "accounts", "dataVersion"})
_ACCOUNT_KEYS = frozenset(
    {
        "accessKey",
        "secretKey",
        "whiteRemoteAddress",
        "admin",
        "defaultTopicPerm",
        "defaultGroupPerm",
        "topicPerms",
        "groupPerms",
    }
)
_NULL_TAG = "tag:yaml.org,2002:null"
_TRUE = frozenset({"true", "yes", "on"})
_FALSE = frozenset({"false", "no", "off"})


class AclFileError(ValueError):
    """A plain_acl.yml that cannot be used; the message is ``FILE:LINE: what is wrong``."""

    def __init__(self, path: str, line: int, what: str) -> None:
        super().__init__(f"{path}:{line}: {what}")
        self.path = path
        self.line = line
        self.what = what


def load_acl_file(path: str | Path) -> AclRules:
    """Read and check an ACL file (AclFileError, or OSError if it cannot be read)."""
    return parse_acl_text(Path(path).read_text(encoding="utf-8"), str(path))


def parse_acl_text(text: str, path: str = "<acl>") -> AclRules:
    """Check the text of an ACL file; `path` is only used in error messages."""
    return _Reader(path).rules(text)


class _Reader:
    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, node: yaml.Node | None, what: str) -> AclFileError:
        line = node.start_mark.line + 1 if node is not None else 1
        return AclFileError(self.path, line, what)

    def rules(self, text: str) -> AclRules:
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line = mark.line + 1 if mark is not None else 1
            raise AclFileError(self.path, line, f"not valid YAML: {e.problem}") from None
        if root is None or self.is_null(root):
            return AclRules()
        top = self.mapping(root, "the file")
        for key, (key_node, _) in top.items():
            if key not in _TOP_KEYS:
                raise self.fail(
                    key_node, f"unknown key {key!r}: expected one of {_sorted(_TOP_KEYS)}"
                )
        white = tuple(
            self.pattern(n) for n in self.sequence(self.value(top, "globalWhiteRemoteAddresses"))
        )
        accounts: dict[str, Account] = {}
        for node in self.sequence(self.value(top, "accounts")):
            account = self.account(node)
            if account.access_key in accounts:
                raise self.fail(node, f"accessKey {account.access_key!r} appears twice")
            accounts[account.access_key] = account
        return AclRules(global_white_addresses=white, accounts=accounts)

    def account(self, node: yaml.Node) -> Account:
        fields = self.mapping(node, "an account")
        for key, (key_node, _) in fields.items():
            if key not in _ACCOUNT_KEYS:
                raise self.fail(
                    key_node,
                    f"unknown account key {key!r}: expected one of {_sorted(_ACCOUNT_KEYS)}",
                )
        access_key = self.required(node, fields, "accessKey")
        if len(access_key) < KEY_MIN_LENGTH:
            raise self.fail(
                fields["accessKey"][1],
                f"accessKey {access_key!r} is {len(access_key)} characters;"
                f" RocketMQ requires at least {KEY_MIN_LENGTH}",
            )
        secret_key = self.required(node, fields, "secretKey")
        if len(secret_key) < KEY_MIN_LENGTH:
            raise self.fail(
                fields["secretKey"][1],
                f"secretKey of account {access_key!r} is {len(secret_key)} characters;"
                f" RocketMQ requires at least {KEY_MIN_LENGTH}",
            )
        perms: dict[str, Permission] = {}
        # Groups first, then topics, as RocketMQ fills its map (PlainAccessResource.build).
        for entry in self.sequence(self.value(fields, "groupPerms")):
            group, perm = self.resource_perm(entry, "group")
            self.put(perms, retry_topic(group), perm, entry, f"group {group!r}")
        for entry in self.sequence(self.value(fields, "topicPerms")):
            topic, perm = self.resource_perm(entry, "topic")
            self.put(perms, topic, perm, entry, f"topic {topic!r}")
        white = self.value(fields, "whiteRemoteAddress")
        return Account(
            access_key=access_key,
            secret_key=secret_key,
            white_remote_address=self.pattern(white) if white else parse_address_pattern(None),
            admin=self.boolean(self.value(fields, "admin")),
            default_topic_perm=self.perm(self.value(fields, "defaultTopicPerm")),
            default_group_perm=self.perm(self.value(fields, "defaultGroupPerm")),
            resource_perms=perms,
        )

    def put(
        self, perms: dict[str, Permission], key: str, perm: Permission, node: yaml.Node, what: str
    ) -> None:
        if key in perms:
            raise self.fail(node, f"{what} is given a permission twice")
        perms[key] = perm

    def resource_perm(self, node: yaml.Node, kind: str) -> tuple[str, Permission]:
        text = self.scalar(node)
        name, sep, word = text.partition("=")
        if not sep or not name.strip() or "=" in word:
            raise self.fail(
                node, f"{kind} permission {text!r} is not NAME=PERMISSION, e.g. {kind}A=SUB"
            )
        try:
            return name.strip(), parse_permission(word)
        except ValueError as e:
            raise self.fail(node, f"{kind} {name.strip()!r}: {e}") from None

    def perm(self, node: yaml.Node | None) -> Permission:
        # Absent means DENY, as Permission.parsePermFromString(null) says.
        if node is None or self.is_null(node):
            return Permission.DENY
        try:
            return parse_permission(self.scalar(node))
        except ValueError as e:
            raise self.fail(node, str(e)) from None

    def pattern(self, node: yaml.Node) -> AddressPattern:
        try:
            return parse_address_pattern(self.scalar(node))
        except ValueError as e:
            raise self.fail(node, str(e)) from None

    def boolean(self, node: yaml.Node | None) -> bool:
        if node is None or self.is_null(node):
            return False
        word = self.scalar(node).lower()
        if word in _TRUE | _FALSE:
            return word in _TRUE
        raise self.fail(node, f"admin must be true or false, not {self.scalar(node)!r}")

    def required(
        self, parent: yaml.Node, fields: dict[str, tuple[yaml.Node, yaml.Node]], key: str
    ) -> str:
        node = self.value(fields, key)
        if node is None or self.is_null(node) or not self.scalar(node).strip():
            raise self.fail(node or parent, f"the account has no {key}")
        return self.scalar(node).strip()

    @staticmethod
    def value(fields: dict[str, tuple[yaml.Node, yaml.Node]], key: str) -> yaml.Node | None:
        pair = fields.get(key)
        return pair[1] if pair is not None else None

    @staticmethod
    def is_null(node: yaml.Node) -> bool:
        return isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG

    def scalar(self, node: yaml.Node) -> str:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, "expected a single value, not a list or a mapping")
        return str(node.value)

    def mapping(self, node: yaml.Node, what: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what} must be a mapping of keys to values")
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = self.scalar(key_node)
            if key in out:
                raise self.fail(key_node, f"key {key!r} appears twice")
            out[key] = (key_node, value_node)
        return out

    def sequence(self, node: yaml.Node | None) -> list[yaml.Node]:
        if node is None or self.is_null(node):
            return []
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, "expected a list (lines starting with '- ')")
        return list(node.value)


def _sorted(keys: frozenset[str]) -> str:
    return ", ".join(sorted(keys))
