"""``troth bench``: load, latency, limits and scale figures for a troth server.

It starts a server (or targets one with ``--url``), drives it over real HTTP and SSE
with N concurrent clients from a lean generator, and prints a table per workload
with the settings in force and the ceilings measured in the same run (raw SQLite on
the same file system, a bare HTTP round trip on the same server stack).  Every
workload verifies what it did before its figures count.  See docs/benchmarks.md.

Modules: ``runner`` (the run), ``workloads`` (the six workloads), ``limits``,
``seed`` (the scale databases), ``http`` and ``client`` (the generator),
``measure`` (window, CPU, RSS), ``report`` (tables), ``profile`` (py-spy),
``bare`` (the bare endpoint), ``procs`` (server subprocesses), ``options``.
"""
