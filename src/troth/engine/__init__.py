"""The engine: runs requests in store transactions and drives the timer."""
