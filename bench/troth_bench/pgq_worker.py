"""The PgQueuer consumer the peer measurement runs: ``python -m troth_bench.pgq_worker``.

A process of its own, as a PgQueuer worker is deployed and as troth's server is
run by the bench: its CPU is read apart from the producers' (the generator), and it
has its own core of Python.  It runs ``consumers`` PgQueuer ``QueueManager`` s, each
on its own asyncpg connection, with one no-op entrypoint (``bench``): what is
measured is the queue — dequeue, dispatch, completion log — not the job.

Protocol with the bench, on stdin/stdout: it prints ``ready`` once connected, starts
consuming when it reads ``go``, and stops on SIGTERM (``continuous``) or by itself
when the queue is empty (``drain``), flushing its completion buffer either way.
After each completion transaction has committed (PgQueuer's ``log_jobs``: the jobs
leave the queue table, their ``successful`` rows enter the log) it prints
``done ID…`` for them, so the bench knows when a job's whole path is durable — not
merely when the handler ran.  A job that did not succeed is printed as ``failed ID…``
and fails the run.  At exit it prints ``cpu SECONDS``: its own user + system time
since ``go`` (start-up and imports are not the queue's work).

pgqueuer and asyncpg are imported by name (``importlib``): they are an optional
extra (``troth-bench[pgqueuer]``), and the type checker must give the same verdict whether
or not they are installed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import resource
import signal
import sys
from datetime import timedelta
from typing import Any

ENTRYPOINT = "bench"
_cpu_at_go = [0.0]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def reporting(log_jobs: Any) -> Any:
    """``Queries.log_jobs`` that says which jobs it completed once it returned."""

    async def log(job_status: list[tuple[Any, str, Any]]) -> None:
        await log_jobs(job_status)
        ok = [str(job.id) for job, status, _ in job_status if status == "successful"]
        bad = [str(job.id) for job, status, _ in job_status if status != "successful"]
        if ok:
            sys.stdout.write("done " + " ".join(ok) + "\n")
        if bad:
            sys.stdout.write("failed " + " ".join(bad) + "\n")
        sys.stdout.flush()

    return log


async def consume(dsn: str, batch: int, consumers: int, mode: str) -> None:
    asyncpg: Any = importlib.import_module("asyncpg")
    pgq: Any = importlib.import_module("pgqueuer")
    types: Any = importlib.import_module("pgqueuer.types")
    managers = []
    for _ in range(consumers):
        conn = await asyncpg.connect(dsn)
        queries = pgq.Queries(pgq.AsyncpgDriver(conn))
        queries.log_jobs = reporting(queries.log_jobs)
        qm = pgq.QueueManager(queries)

        async def job(_job: Any) -> None:
            return None

        qm.entrypoint(ENTRYPOINT)(job)
        managers.append(qm)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: [m.shutdown.set() for m in managers])
    print("ready", flush=True)
    line = await loop.run_in_executor(None, sys.stdin.readline)
    if line.strip() != "go":
        return
    _cpu_at_go[0] = _cpu()
    run_mode = getattr(types.QueueExecutionMode, mode)
    await asyncio.gather(
        *(
            m.run(batch_size=batch, mode=run_mode, dequeue_timeout=timedelta(seconds=5))
            for m in managers
        )
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m troth_bench.pgq_worker")
    p.add_argument("dsn")
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--consumers", type=int, default=1)
    p.add_argument("--mode", choices=["continuous", "drain"], default="continuous")
    args = p.parse_args(argv)
    import uvloop

    try:
        uvloop.run(consume(args.dsn, args.batch, args.consumers, args.mode))
    finally:
        print(f"cpu {_cpu() - _cpu_at_go[0]:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
