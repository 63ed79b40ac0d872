"""RocketMQ's ACL signature over remoting, for the client that signs and the broker that checks.

As RocketMQ 4.x/5.x does it (acl/common/AclClientRPCHook.java, AclUtils.java,
SessionCredentials.java, AclSigner.java; the broker's plain/PlainAccessValidator.java):

* the client adds ext fields ``AccessKey`` (and ``SecurityToken`` when it has one) to the
  request, then ``Signature``;
* the content signed is the values of every ext field but ``Signature``, in the order of
  their keys (Java's TreeMap: by UTF-16 code unit, the same as by code point for the
  ASCII keys RocketMQ uses), concatenated and UTF-8 encoded, followed by the body bytes;
* ``Signature`` = base64(HMAC-SHA1(secret key, content)).

The broker leaves ``_UNIQUE_KEY_QUERY`` (MixAll.UNIQUE_MSG_QUERY_FLAG) out of the content
too, although the Java client signs it (it adds the field to QUERY_MESSAGE before sending):
`verify` accepts either content, so that query by key works for both.

A refused request is answered SYSTEM_ERROR with the AclException in the remark (RocketMQ's
NettyRemotingAbstract answers any exception of its RPC hooks so); `acl_refusal` tells an
unknown caller from a known one without the permission.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Collection, Mapping
from enum import Enum

from sdk._remoting.codes import ResponseCode

ACCESS_KEY = "AccessKey"
SECURITY_TOKEN = "SecurityToken"
SIGNATURE = "Signature"
#: MixAll.UNIQUE_MSG_QUERY_FLAG: the broker does not sign it.
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"
#: How the remark of an ACL refusal begins (the exception's Java class, as RocketMQ names it).
ACL_EXCEPTION = "org.apache.rocketmq.acl.common.AclException"

#: What a client leaves out of the content: the signature itself.
CLIENT_EXCLUDED: frozenset[str] = frozenset({SIGNATURE})
#: What RocketMQ's broker leaves out.
BROKER_EXCLUDED: frozenset[str] = frozenset({SIGNATURE, UNIQUE_MSG_QUERY_FLAG})


def content_to_sign(
    ext_fields: Mapping[str, str], body: bytes, *, excluded: Collection[str] = CLIENT_EXCLUDED
) -> bytes:
    """The bytes signed: the values sorted by key (but `excluded`), then the body."""
    text = "".join(ext_fields[key] for key in sorted(ext_fields) if key not in excluded)
    return text.encode("utf-8") + body


def signature(secret_key: str, content: bytes) -> str:
    """base64(HMAC-SHA1(secret_key, content)), as AclSigner computes it."""
    mac = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


def signed_fields(
    ext_fields: Mapping[str, str],
    body: bytes,
    access_key: str,
    secret_key: str,
    security_token: str | None = None,
) -> dict[str, str]:
    """`ext_fields` with AccessKey, SecurityToken (if given) and Signature added.

    A Signature already there is replaced (a request signed again is signed afresh).
    """
    fields = {k: v for k, v in ext_fields.items() if k != SIGNATURE}
    fields[ACCESS_KEY] = access_key
    if security_token is not None:
        fields[SECURITY_TOKEN] = security_token
    fields[SIGNATURE] = signature(secret_key, content_to_sign(fields, body))
    return fields


def verify(ext_fields: Mapping[str, str], body: bytes, secret_key: str) -> bool:
    """Whether the request's Signature is the one `secret_key` makes of it.

    The content is the broker's (without _UNIQUE_KEY_QUERY) or, when that field is there,
    the Java client's (with it). Compared in constant time.
    """
    given = ext_fields.get(SIGNATURE)
    if given is None:
        return False
    candidates = [BROKER_EXCLUDED]
    if UNIQUE_MSG_QUERY_FLAG in ext_fields:
        candidates.append(CLIENT_EXCLUDED)
    return any(
        hmac.compare_digest(
            signature(secret_key, content_to_sign(ext_fields, body, excluded=excluded)).encode(),
            given.encode("utf-8", "replace"),
        )
        for excluded in candidates
    )


class AclRefusal(Enum):
    """What an ACL refusal over remoting says of the caller."""

    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission denied"


#: Words of RocketMQ's (PlainPermissionManager.validate) and ordermq's messages for a
#: caller the ACL does not know or whose signature is wrong; any other AclException is a
#: permission refused.
_UNAUTHENTICATED_HINTS = (
    "no accesskey is configured",
    "no acl config for",
    "no plainaccessresource",
    "signature",
    "carries no accesskey",
    "no account has accesskey",
)


def acl_refusal(code: int, remark: str | None) -> AclRefusal | None:
    """The kind of ACL refusal a response is, or None if it is not one."""
    if code != ResponseCode.SYSTEM_ERROR or not remark or ACL_EXCEPTION not in remark:
        return None
    text = remark.lower()
    if any(hint in text for hint in _UNAUTHENTICATED_HINTS):
        return AclRefusal.UNAUTHENTICATED
    return AclRefusal.PERMISSION_DENIED
