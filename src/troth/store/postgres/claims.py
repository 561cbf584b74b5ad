"""Messages inserted already claimed: when a batch's own messages skip the claim.

A batch that claims due outbox rows just before its COMMIT (``BatchClaim``,
``Store.execute``'s ``claim_in_batch``) would insert its messages pending and then
update each to dispatching.  When that claim would take exactly these rows, the
insert writes them claimed instead (``PostgresBackend.claim_on_insert``): one
statement fewer on the batch's path, and no dead row version each
(docs/performance-notes.md, "Messages inserted claimed").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

from troth.store.base import BatchClaim
from troth.store.postgres.rows import Q

#: The groups and ``group/id`` pairs this node holds SSE connections for, asked from
#: the writer thread (``outbox.Routing.reach``).
Reach = Callable[[], tuple[Sequence[str], Sequence[str]]]

#: A message row's columns (``message_row`` order), as ``insert_claimed_messages``
#: names its arrays.
MESSAGE_COLUMNS: Final = (
    "keys", "address", "kind", "task_id", "version", "promise", "created", "due", "cast_",
    "grp", "dest",
)  # fmt: skip


#: ``insert_claimed_messages`` without its delete of the pending rows of the same keys,
#: for a batch whose messages are all the first ``execute`` of a task this transaction
#: creates (an INSERT among its deferred writes): no pending row can have that key
#: (an earlier task of the id took its pending rows along when it was deleted).  The
#: delete is planned over the whole ``pending`` range of ``outbox_state_available``,
#: never the unique key index: while a snapshot holds the horizon back, that range
#: fills with the dead entries of every claim, and the delete walked them in every
#: batch.
INSERT_CLAIMED_FRESH: Final = Q["insert_claimed_messages"][
    Q["insert_claimed_messages"].index("INSERT INTO outbox") :
]


def claimable(rows: Sequence[tuple[Any, ...]], claim: BatchClaim, reach: Reach | None) -> bool:
    """Whether a claim made right after these rows were written would take every one
    of them: each due by ``claim.now``, no more than its limit, and each this node's
    to deliver — an http(s) row, or (``reach``: a node of several, ``claim_routed``)
    a poll:// row for a ``group/id`` this node holds, or for any id of a group it
    holds.  Anything else is the claim statement's to decide."""
    if len(rows) > claim.limit:
        return False
    groups: Collection[str] = ()
    pairs: Collection[str] = ()
    if reach is not None and any(row[9] is not None for row in rows):
        held_groups, held_pairs = reach()
        groups, pairs = set(held_groups), set(held_pairs)
    for row in rows:
        if row[7] > claim.now:
            return False
        cast, group, id = row[8], row[9], row[10]
        if reach is None or group is None:
            continue
        if id is not None and f"{group}/{id}" in pairs:
            continue
        if cast == "any" and id is None and group in groups:
            continue
        return False
    return True
