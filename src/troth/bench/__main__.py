"""``python -m troth.bench``: the same as ``troth bench``."""

from troth.bench.runner import main

raise SystemExit(main())
