"""The HTTP face of a node: the ASGI app and its routes (``app.py``), the SSE
streams workers hold (``sse.py``), the httptools path that answers a simple
``POST /`` without ASGI (``direct.py``, ``timeouts.py``), CORS and what ``/metrics``
reads when scraped."""
