"""Delivery, the server's side of the outbox: the loop that drives the dispatcher
(``loop.py``), the backoff of tasks that keep bouncing, and the membership of a
node among several sharing PostgreSQL, which routes ``poll://`` rows to the node
that holds the worker's stream (``cluster.py``)."""
