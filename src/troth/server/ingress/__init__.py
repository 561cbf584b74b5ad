"""What every ingress shares, HTTP ``POST /`` and NATS alike: the one envelope
handler (``envelope.py``), auth, the access log and the debug surface; and the NATS
ingress itself (``nats.py``)."""
