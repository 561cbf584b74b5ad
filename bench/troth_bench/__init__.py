"""``troth bench``: load, latency, limits and scale figures for a troth server.

It starts a server (or targets one with ``--url``), drives it over real HTTP and SSE
with N concurrent clients from a lean generator, and prints a table per workload
with the settings in force and the ceilings measured in the same run (raw SQLite on
the same file system, a bare HTTP round trip on the same server stack).  Every
workload verifies what it did before its figures count.  See docs/benchmarks.md.

On PostgreSQL (``--store postgres``) it runs one node or several on one database
(``--nodes``), measures the server's raw commit rates instead of SQLite's, and can
measure a peer job queue, PgQueuer, beside troth (``--peers pgqueuer``).

Modules: ``runner`` (the run), ``workloads`` (the workloads), ``limits``,
``seed`` (the scale databases), ``http`` and ``client`` (the generator),
``measure`` (window, CPU, RSS), ``report`` (tables), ``profile`` (py-spy),
``bare`` (the bare endpoint), ``procs`` (server subprocesses), ``options``,
``pg`` (throwaway databases, the PostgreSQL ceilings, its CPU), ``peers`` and
``pgq_worker`` (PgQueuer, an optional extra).

The lab is a distribution of its own, ``troth-bench`` (``bench/`` in troth's checkout:
``pip install -e ./bench``), at troth's release and pinned to it; troth's wheel
carries none of it, and ``troth bench`` without it says how to install it.
"""
