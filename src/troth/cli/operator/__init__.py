"""The commands that speak troth's operator API (``/ops/…``) rather than the protocol:
``explain``, ``workers``, ``outbox`` (inspect.py), ``cancel`` and ``outbox retry``
(actions.py), ``limits`` (limits.py).  They need a troth server; the protocol commands
(cli/client.py) work against any server of the protocol."""
