"""Transactional messages over RocketMQ's remoting: END_TRANSACTION and check-back.

The core is mockbroker/transactions.py; this only translates. A half message comes as a
send with the prepared sysFlag or TRAN_MSG=true (data_handlers.py); its reply's
queueOffset is its offset in the half queue (RocketMQ's tranStateTableOffset) and its
msgId (an offsetMsgId) its commit-log position.

- END_TRANSACTION (37) ends it: `commitOrRollback` 8 commits, 12 rolls back, 0 (not
  type) changes nothing. The transaction is the one of the header's `msgId` (the
  UNIQ_KEY) at `tranStateTableOffset`; `commitLogOffset` is read (it is required) but the
  half queue's offset is what names it. RocketMQ's clients send it oneway: a refusal is
  then only logged. Sent as a request it is answered once its outcome is durable;
  SYSTEM_ERROR names a transaction not pending (TRANSACTION_NOT_FOUND: never sent, or
  ended the other way) or of another producer group (WRONG_PRODUCER_GROUP). Ending it
  again the same way succeeds. RocketMQ's broker does not answer a "not type" end at all;
  this one answers a two-way one SUCCESS, so no client waits out its timeout.
- CHECK_TRANSACTION_STATE (39) is sent, oneway, to one connection of the half message's
  producer group, each in turn, as the core picks it: every connection whose heartbeat
  named the group in its producerDataSet offers to answer (RemotingClients; at most
  MAX_PRODUCER_GROUPS groups per connection). Its header
  is RocketMQ's (tranStateTableOffset, commitLogOffset, msgId and transactionId = the
  UNIQ_KEY, offsetMsgId), its body the half message in RocketMQ's stored layout under its
  real topic and queue. The producer answers with END_TRANSACTION, fromTransactionCheck.
"""

from __future__ import annotations

import logging

from mockbroker.errors import BrokerError
from mockbroker.fronts.remoting.channel import ClientChannel, Handler
from mockbroker.fronts.remoting.errors import refusal
from mockbroker.state import BrokerState
from mockbroker.transactions import Check, transaction_id
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import Fields, RemotingCommand, RemotingError
from sdk._remoting.message_ids import SocketAddress, create_offset_msg_id
from sdk._remoting.translate import encode_served, msg_id_for_uniq_key, rocketmq_uniq_key
from sdk._wire import iter_records

log = logging.getLogger("mockbroker.remoting")

#: END_TRANSACTION's commitOrRollback: MessageSysFlag's transaction types.
TRANSACTION_NOT_TYPE = 0
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
_END_TYPES = (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE)


def transaction_handlers(state: BrokerState) -> dict[int, Handler]:
    """The handlers of the transaction request codes (END_TRANSACTION)."""
    handlers = _Transactions(state)
    return {RequestCode.END_TRANSACTION: handlers.end_transaction}


def check_request(check: Check, store_host: SocketAddress) -> RemotingCommand:
    """CHECK_TRANSACTION_STATE (39) for a check-back of the core."""
    [half] = iter_records(check.record, verify_crc=False)
    uniq = rocketmq_uniq_key(half)
    return RemotingCommand(
        RequestCode.CHECK_TRANSACTION_STATE,
        ext_fields={
            "tranStateTableOffset": str(check.half_offset),
            "commitLogOffset": str(check.position),
            "msgId": uniq,
            "transactionId": uniq,
            "offsetMsgId": create_offset_msg_id(store_host, check.position),
        },
        body=encode_served(check.record, [check.position], store_host),
    )


class _Transactions:
    def __init__(self, state: BrokerState) -> None:
        self._s = state

    async def end_transaction(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand | None:
        """END_TRANSACTION (37): commit or roll back a half message, or nothing."""
        try:
            fields = Fields.of(request)
            group = fields.string("producerGroup")
            offset = fields.integer("tranStateTableOffset")
            fields.integer("commitLogOffset")
            kind = fields.integer("commitOrRollback", bits=32)
            uniq = fields.string("msgId")
            from_check = fields.boolean("fromTransactionCheck")
            if kind not in _END_TYPES:
                raise RemotingError(
                    ResponseCode.SYSTEM_ERROR,
                    f"commitOrRollback {kind} is none of 0 (unknown), 8 (commit), 12 (rollback)",
                )
            if kind == TRANSACTION_NOT_TYPE:
                log.info("transaction %s of group %s left unknown by its producer%s: %s",
                         uniq, group, " (check-back)" if from_check else "",
                         request.remark or "no remark")  # fmt: skip
                if request.is_oneway:
                    return None
                return request.response(remark="the transaction stays unknown; checked back later")
            txn = transaction_id(msg_id_for_uniq_key(uniq), offset)
            await self._s.transactions.end(group, txn, kind == TRANSACTION_COMMIT_TYPE)
        except (RemotingError, BrokerError) as exc:
            refused = refusal(exc) if isinstance(exc, BrokerError) else exc
            if request.is_oneway:
                log.warning("END_TRANSACTION from %s refused: %s", channel.peer, refused.remark)
                return None
            raise refused from None
        return None if request.is_oneway else request.response()
