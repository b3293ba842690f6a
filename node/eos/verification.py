"""Partition-side verification of transactional writes (KIP-890 part 1, Jepsen's Bufstream find).

Owns the rule deciding whether a producer's write may join, start or not touch a transaction on
one partition, given that partition's applied (or leader's in-flight) producer state.
Invariants: a write of an older epoch never joins any transaction (producer_fenced); a write of a
newer epoch never joins the transaction still open here (invalid_txn_state: its marker is not yet
written); a non-transactional write never lands inside an open transaction of its producer; a
transactional write that would start a transaction here is accepted by a leader only after the
coordinator has confirmed (producer id, epoch) holds an open transaction that includes this
partition (needs_verification until then). Since every transaction end bumps the epoch (TV2) and
its markers carry the bumped epoch, a late write of transaction T1 can never join T2.
"""

from __future__ import annotations

from enum import StrEnum


class TxnCheck(StrEnum):
    JOIN = "join"  # joins the transaction open here (same producer id and epoch)
    START = "start"  # starts a transaction here: the coordinator has verified it
    NOT_TRANSACTIONAL = "not_transactional"  # a plain idempotent write outside transactions
    NEEDS_VERIFICATION = "needs_verification"
    FENCED = "producer_fenced"
    INVALID_TXN_STATE = "invalid_txn_state"


def check_transactional_write(
    *,
    current_epoch: int | None,
    open_txn: bool,
    write_epoch: int,
    transactional: bool,
    verified: bool,
) -> TxnCheck:
    """What one data write of a producer may do on this partition.

    `current_epoch` is the producer's epoch in this partition's state (None: unknown producer),
    `open_txn` whether its transaction is open here, `verified` whether the coordinator confirmed
    (producer id, `write_epoch`) as the open transaction holding this partition. Applying a
    committed entry passes verified=True: the leader verified before proposing it.
    """
    if current_epoch is not None and write_epoch < current_epoch:
        return TxnCheck.FENCED
    if open_txn:
        if not transactional:
            return TxnCheck.INVALID_TXN_STATE
        if write_epoch != current_epoch:
            return TxnCheck.INVALID_TXN_STATE
        return TxnCheck.JOIN
    if not transactional:
        return TxnCheck.NOT_TRANSACTIONAL
    return TxnCheck.START if verified else TxnCheck.NEEDS_VERIFICATION
