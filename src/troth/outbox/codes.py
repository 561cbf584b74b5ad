"""Stable codes the dispatcher records on rows it settled itself.

They are part of the interface: operators alert on them and tests match them, so a
code is never renamed, only added.
"""

from typing import Final

ATTEMPTS_EXHAUSTED: Final = "troth.dispatch.attempts_exhausted"
SEND_TIMEOUT: Final = "troth.dispatch.send_timeout"
SEND_CRASHED: Final = "troth.dispatch.send_crashed"
CLAIM_EXPIRED: Final = "troth.dispatch.claim_expired"
#: The claiming node stopped heartbeating (server/delivery/cluster.py); reaped before expiry.
NODE_DEAD: Final = "troth.dispatch.node_dead"
RECONCILED_FAILED: Final = "troth.dispatch.reconciled_failed"
RESENDS_EXHAUSTED: Final = "troth.dispatch.resends_exhausted"
#: Recorded by the store on a requeued row that a newer pending row of its key
#: replaced (at most one pending row per key).
SUPERSEDED: Final = "troth.dispatch.superseded"

NO_CONNECTION: Final = "troth.poll.no_connection"
CONNECTION_LOST: Final = "troth.poll.connection_lost"
BAD_ADDRESS: Final = "troth.address.unsupported"
HTTP_REFUSED: Final = "troth.http.connect_refused"
HTTP_STATUS: Final = "troth.http.status_"  # + the status code, e.g. troth.http.status_503
HTTP_ERROR: Final = "troth.http.error"
#: nats:// (transport/nats.py): not connected to NATS, nothing written.
NATS_DISCONNECTED: Final = "troth.nats.disconnected"
#: nats://: NATS answered "no responders": nobody subscribes to the subject.
NATS_NO_RESPONDERS: Final = "troth.nats.no_responders"
#: nats://: published, but the flush that would confirm it failed or timed out.
NATS_FLUSH_FAILED: Final = "troth.nats.flush_failed"
#: nats://: the message exceeds the NATS server's max_payload.
NATS_TOO_LARGE: Final = "troth.nats.too_large"
#: nats:// with no nats_url configured: this node cannot deliver it.
NATS_OFF: Final = "troth.nats.not_configured"
