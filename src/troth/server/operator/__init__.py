"""The operator's surfaces: the read-only API (``GET /ops/…``, ``api.py``), the
actions (``POST /ops/…``: cancel a workflow, retry deliveries, limits) and the
retention loop that deletes settled workflows in the background."""
