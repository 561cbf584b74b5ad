"""``python -m troth_bench``: the same as ``troth bench``."""

from troth_bench.runner import main

raise SystemExit(main())
