"""The bodies workers receive (SDK-CLIENTS.md §2.5), one line of JSON each."""

from __future__ import annotations

import msgspec

from troth.protocol.records import Execute, Message

_encoder = msgspec.json.Encoder()


def message_body(message: Message, server_url: str) -> bytes:
    """``execute`` carries ``head.serverUrl`` (the AWS shim finds its way back with it);
    ``unblock`` carries the settled promise record.  JSON never contains a raw newline,
    so each message fits one SSE ``data:`` line."""
    if isinstance(message, Execute):
        return _encoder.encode(
            {
                "kind": "execute",
                "head": {"serverUrl": server_url},
                "data": {"task": {"id": message.task_id, "version": message.version}},
            }
        )
    return _encoder.encode({"kind": "unblock", "head": {}, "data": {"promise": message.promise}})
