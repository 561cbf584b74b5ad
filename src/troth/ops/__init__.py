"""What an operator sees: the explanation of a stuck workflow and the read-only
operator API (``/ops/…``) that the CLI and the dashboard share."""
