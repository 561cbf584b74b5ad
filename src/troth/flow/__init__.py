"""Flow control: limits per worker group that the server enforces (docs/operations.md,
"Flow control").  ``limits`` holds what a limit is, ``gate`` how a job keeps to it."""
