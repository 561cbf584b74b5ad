"""PostgreSQL for the bench: throwaway databases, the raw commit ceilings, its CPU.

Why each piece is here:

* **Throwaway databases.**  A run on PostgreSQL must start from an empty database
  (the figures of a table full of an earlier run's rows are not the same figures),
  and must not leave one behind.  Without ``--postgres-url`` the bench creates
  ``troth_bench_<random>`` on the local cluster (``--postgres-admin-url``) and
  drops it when the run ends (``WITH (FORCE)``: a node that died holding a
  connection cannot keep it).
* **The ceilings.**  troth's rates on PostgreSQL mean little without what the same
  server does with nothing but durable commits, measured minutes apart: one row per
  commit at the run's concurrency (what a server without group commit could do at
  best), the same on one connection (the latency of one durable commit), and 100
  rows per commit (what batching buys at best).  ``pgbench`` is the probe when it is
  on PATH: it is C, so at ~10k commits/s the client is not what is measured; it runs
  a custom script of one ``INSERT`` of a promise-sized row per transaction, in
  prepared mode, and logs each transaction's latency for the percentiles.  Without
  pgbench, a psycopg insert loop with the same connections does it (and says so).
* **CPU.**  PostgreSQL's work happens in its own processes; left out, it would show
  as "other load on the machine".  The backends connected to the run's databases
  and the cluster's background processes (WAL writer, checkpointer, …) are read from
  ``pg_stat_activity`` so the bench can read their CPU from ``/proc`` (a local server
  only: for a remote one the figure is absent).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from troth_bench.limits import ROW
from troth_bench.measure import Samples

#: Background processes whose CPU is PostgreSQL's work for every database.
SHARED_BACKENDS = ("walwriter", "checkpointer", "background writer", "autovacuum launcher")


def url_of(base: str, dbname: str) -> str:
    """``base`` pointed at database ``dbname`` (same host, port, user, options)."""
    params = conninfo_to_dict(base)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def as_uri(url: str) -> str:
    """``url`` as a ``postgresql://`` URI (asyncpg, which PgQueuer uses, reads no
    ``key=value`` strings)."""
    params = {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
    user = quote(params.pop("user", ""), safe="")
    password = params.pop("password", None)
    host = params.pop("host", "")
    port = params.pop("port", "")
    dbname = quote(params.pop("dbname", ""), safe="")
    if host.startswith("/"):  # a socket directory goes in the query string
        params["host"] = host
        host = ""
    auth = user + (":" + quote(password, safe="") if password else "") + "@" if user else ""
    netloc = auth + host + (f":{port}" if port else "")
    query = ("?" + urlencode(params)) if params else ""
    return f"postgresql://{netloc}/{dbname}{query}"


def dbname_of(url: str) -> str:
    return str(conninfo_to_dict(url).get("dbname") or "")


#: What the error of an unreachable server tells the bench's user to do.  The tests'
#: throwaway databases (tests/helpers/pg.py) are these, with their own hint.
BENCH_HINT = "the postgres bench needs a server (give one with --postgres-url)"


def _admin(base: str, hint: str = BENCH_HINT) -> psycopg.Connection[tuple[Any, ...]]:
    try:
        return psycopg.connect(base, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise RuntimeError(f"PostgreSQL is unreachable at {base} ({exc}); {hint}") from exc


def create_database(base: str, prefix: str = "troth_bench", *, hint: str = BENCH_HINT) -> str:
    """Create an empty database on ``base``'s server; returns its connection string."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with _admin(base, hint) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return url_of(base, name)


def drop_database(base: str, url: str, *, hint: str = BENCH_HINT) -> None:
    """Drop the database of ``url``, disconnecting whatever still holds it (a run or a
    test that failed midway)."""
    name = dbname_of(url)
    with _admin(base, hint) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@contextmanager
def throwaway(base: str, prefix: str = "troth_bench", *, hint: str = BENCH_HINT) -> Iterator[str]:
    """A fresh database for the ``with`` block, dropped after it."""
    url = create_database(base, prefix, hint=hint)
    try:
        yield url
    finally:
        drop_database(base, url, hint=hint)


def server_version(base: str) -> str:
    with _admin(base) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (["synchronous_commit", "fsync", "wal_sync_method", "commit_delay"],),
            ).fetchall()
        )
    version = str(row[0]).split()[0] if row else "?"
    shown = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))
    return f"PostgreSQL {version} ({shown})"


def database_size(url: str) -> int:
    with _admin(url) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return int(row[0]) if row else 0


def backend_pids(base: str, databases: list[str]) -> list[int]:
    """PostgreSQL processes doing the run's work: backends of ``databases`` and the
    cluster's shared background processes.  Empty when the server is not local."""
    host = str(conninfo_to_dict(base).get("host") or "")
    if host not in ("", "127.0.0.1", "localhost", "::1") and not host.startswith("/"):
        return []
    try:
        with _admin(base) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = ANY(%s)"
                " OR backend_type = ANY(%s)",
                (databases, list(SHARED_BACKENDS)),
            ).fetchall()
            own = conn.execute("SELECT pg_backend_pid()").fetchone()
    except (psycopg.Error, RuntimeError):
        return []
    skip = int(own[0]) if own else -1
    return [int(r[0]) for r in rows if int(r[0]) != skip]


# -- the ceilings -------------------------------------------------------------------------


PROBE_TABLE = (
    "CREATE TABLE probe (id TEXT PRIMARY KEY, state TEXT NOT NULL, body TEXT NOT NULL);"
    " CREATE SEQUENCE probe_seq"
)
#: One promise-sized row per transaction (``:body`` is a pgbench variable: a literal
#: holding ``:`` would be taken for one).
ONE_ROW = "INSERT INTO probe VALUES ('s' || nextval('probe_seq'), 'pending', :body);\n"
HUNDRED_ROWS = (
    "INSERT INTO probe SELECT 'b' || nextval('probe_seq'), 'pending', :body"
    " FROM generate_series(1, 100);\n"
)


def find_pgbench() -> str | None:
    return shutil.which("pgbench")


def _pgbench(
    exe: str, url: str, script: str, clients: int, seconds: float, workdir: Path, log: str | None
) -> tuple[float, Samples]:
    """Run one pgbench probe; returns (transactions/s, latencies from --log)."""
    path = workdir / "pgbench-probe.sql"
    path.write_text(script)
    argv = [
        exe,
        "-n",  # no vacuum of pgbench's own tables (there are none)
        "-f",
        str(path),
        "-D",
        f"body={ROW}",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(max(1, min(clients, 2))),
        "-T",
        str(max(1, round(seconds))),
    ]
    if log is not None:
        argv += ["--log", f"--log-prefix={workdir / log}"]
    proc = subprocess.run([*argv, url], capture_output=True, text=True, timeout=seconds + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"pgbench failed ({proc.returncode}): {proc.stderr[-500:]}")
    tps = 0.0
    for line in proc.stdout.splitlines():
        if line.startswith("tps ="):
            tps = float(line.split()[2])
    latency = Samples()
    if log is not None:
        for f in sorted(workdir.glob(f"{log}.*")):
            for line in f.read_text().splitlines():
                fields = line.split()
                if len(fields) >= 3:
                    latency.add(int(fields[2]) / 1e6)
            f.unlink()
    path.unlink()
    return tps, latency


async def _python_loop(
    url: str, rows: int, clients: int, seconds: float, prefix: str
) -> tuple[float, Samples]:
    """The same probe without pgbench: ``clients`` psycopg connections in a loop."""
    conns = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(clients)]
    latency = Samples()
    done = [0]
    end = time.perf_counter() + seconds
    statement = (
        "INSERT INTO probe VALUES (%s || nextval('probe_seq'), 'pending', %s)"
        if rows == 1
        else "INSERT INTO probe SELECT %s || nextval('probe_seq'), 'pending', %s"
        f" FROM generate_series(1, {rows})"
    )

    async def loop(conn: psycopg.AsyncConnection[Any]) -> None:
        while (started := time.perf_counter()) < end:
            await conn.execute(statement, (prefix, ROW))
            latency.add(time.perf_counter() - started)
            done[0] += 1

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(loop(c) for c in conns))
    finally:
        for c in conns:
            await c.close()
    return done[0] / (time.perf_counter() - t0), latency


def postgres_limits(base: str, clients: int, seconds: float, workdir: Path) -> dict[str, Any]:
    """The three ceilings on a throwaway database of ``base``'s server."""
    exe = find_pgbench()
    out: dict[str, Any] = {"method": "pgbench" if exe else "psycopg insert loop"}
    with throwaway(base, "troth_bench_probe") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(PROBE_TABLE)
        for key, script, rows, n, log in (
            ("commits", ONE_ROW, 1, clients, "many"),
            ("serial", ONE_ROW, 1, 1, "one"),
            ("rows", HUNDRED_ROWS, 100, 1, None),
        ):
            if exe:
                rate, latency = _pgbench(exe, url, script, n, seconds, workdir, log)
            else:
                rate, latency = asyncio.run(_python_loop(url, rows, n, seconds, key[0]))
            out[key] = rate * rows
            out[f"{key}_latency"] = latency.percentiles() if log else {}
    return out
