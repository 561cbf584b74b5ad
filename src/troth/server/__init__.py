"""The server: one troth process around one engine.

Here, the process: ``run`` builds the store, the engine, the transports and the app
from the settings and serves them under uvicorn (the one place where they are wired
to one another); ``config`` (defaults, ``troth.toml``, ``TROTH_*``, flags),
``startup``, ``announcing`` and ``stopping`` (how a start fails, says it listens,
and stops), ``workers`` (``--workers N``), ``logs``, ``metrics`` and ``tracing``
(hooks the app is given, imported only when tracing is on).

Beside it, one package per side of the node: ``http`` (the ASGI app and its routes,
SSE, the ``POST /`` that skips ASGI), ``ingress`` (the envelope handler HTTP and
NATS share, auth, the access log; the NATS ingress), ``delivery`` (the loop that
drives the outbox dispatcher, the bounce backoff, cluster membership) and
``operator`` (the operator API, its actions, retention).
"""
