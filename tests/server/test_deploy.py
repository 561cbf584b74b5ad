"""The Grafana dashboard and the Prometheus alert rules shipped in ``deploy/``.

The rules pass ``promtool check rules``; a running server's ``/metrics`` passes
``promtool check metrics``; and every metric a panel or a rule names is in that
exposition, read from a real node on PostgreSQL (so the cluster's metrics are there)
with retention on, after traffic that pushes to a real HTTP endpoint, bounces a
task, and sends to an address no transport serves — and, for flow control's gauges
(PostgreSQL keeps no limits yet), from a node on SQLite with a limit and held tasks.
Rules whose timing matters are unit-tested with ``promtool test rules``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers.hook import hook_server
from helpers.pg import throwaway_database
from helpers.support import RunningServer, running_server
from troth.server.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "troth.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed: apt-get install prometheus (scripts/test does)",
)
#: Metrics Prometheus makes itself, not troth.
PROMETHEUS_OWN = {"up"}
FAR = 10**13


def wait(what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", ())]


def rule_exprs() -> list[str]:
    # The rules file is YAML; its expressions are the `expr:` values (one line, or a
    # block after `expr: |`), read without a YAML library.
    exprs: list[str] = []
    lines = ALERTS.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if not m:
            continue
        if m.group(2).strip() not in ("|", ">", "|-", ">-"):
            exprs.append(m.group(2))
            continue
        indent = len(m.group(1))
        block = []
        for more in lines[i + 1 :]:
            if more.strip() and len(more) - len(more.lstrip()) <= indent:
                break
            block.append(more)
        exprs.append("\n".join(block))
    return exprs


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers followed by a selector
    or a range, and ``troth_…`` names wherever they stand (label names, functions
    and keywords are not metric names)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    names = set(re.findall(r"\btroth_[a-z0-9_]+\b", without_strings))
    names |= {n for n in re.findall(r"\b([a-z_]+)\s*\{", without_strings) if n in PROMETHEUS_OWN}
    return names


def exposed(text: str) -> set[str]:
    """Metric names with samples in an exposition; a histogram's ``_bucket``,
    ``_sum`` and ``_count`` also count as its own name."""
    names: set[str] = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line)
            assert name is not None, line
            names.add(name.group(0))
    for name in list(names):
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix):
                names.add(name[: -len(suffix)])
    return names


def test_the_files_name_enough_metrics_to_be_read() -> None:
    """The parsers above find what the files hold (a parser that found nothing would
    make the check below pass for nothing)."""
    assert len(dashboard_exprs()) >= 25
    assert len(rule_exprs()) >= 8
    names = set().union(*map(metric_names, dashboard_exprs() + rule_exprs()))
    assert {"troth_requests_total", "troth_outbox_rows", "troth_timer_lag_seconds", "up"} <= names
    assert metric_names('sum by (le) (rate(troth_x_bucket{a="troth_not"}[5m]))') == {
        "troth_x_bucket"
    }


def folded_description(alert: str) -> str:
    """An alert rule's description as promtool renders it (folded to one line)."""
    text = ALERTS.read_text()
    block = text[text.index(f"alert: {alert}") :]
    folded = block[block.index("description: >-") + len("description: >-") :]
    return " ".join(folded.split("- alert:")[0].split())


def promtool_test_rules(tmp_path: Path, cases: str) -> None:
    """``promtool test rules`` of the alert rules over ``cases``: one test's
    ``input_series`` and ``alert_rule_test``, every minute."""
    assert PROMTOOL is not None
    path = tmp_path / "rules_test.yml"
    head = f"rule_files: [{ALERTS}]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n"
    path.write_text(head + cases)
    r = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_alert_rules_pass_promtool() -> None:
    assert PROMTOOL is not None
    r = subprocess.run(
        [PROMTOOL, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def node() -> Iterator[RunningServer]:
    with throwaway_database("troth_deploy") as url:
        settings = Settings(
            store="postgres",
            postgres_url=url,
            retention="1d",
            retention_interval=0.2,
            access_log=False,
        )
        with running_server(settings) as server:
            yield server


def traffic(server: RunningServer) -> None:
    """A push delivered to a real endpoint, a task bounced three times (its execute
    held back), a message to an address no transport serves, reads and a refusal."""
    with hook_server() as hook:
        target = {"resonate:target": f"http://127.0.0.1:{hook.port}/run"}
        server.ok("promise.create", {"id": "wf", "timeoutAt": FAR, "tags": target})
        wait("an execute pushed", lambda: any(b.get("kind") == "execute" for _, b in hook.seen))
        for _ in range(3):
            task = server.ok("task.get", {"id": "wf"})["task"]
            acquire = {"id": "wf", "version": task["version"], "pid": "w", "ttl": 60_000}
            version = server.ok("task.acquire", acquire)["task"]["version"]
            server.ok("task.release", {"id": "wf", "version": version})
    odd = {"resonate:target": "gopher://nowhere/x"}
    server.ok("promise.create", {"id": "odd", "timeoutAt": FAR, "tags": odd})
    assert server.call("promise.get", {"id": "missing"})[0] == 404
    assert server.call("promise.create", {"id": "bad"})[0] == 400


def scrape(server: RunningServer) -> str:
    r = server.client.get("/metrics")
    assert r.status_code == 200
    return r.text


@pytest.fixture(scope="module")
def exposition(node: RunningServer) -> str:
    """``/metrics`` after :func:`traffic` and a retention pass."""
    traffic(node)
    wait("a retention pass", lambda: "troth_retention_passes_total" in scrape(node))
    wait("the undeliverable send", lambda: 'code="troth.address.unsupported"} 1' in scrape(node))
    return scrape(node)


@pytest.fixture(scope="module")
def flow_exposition(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``/metrics`` of a SQLite node whose group ``payments`` has a limit of 2 and
    five tasks: two hold its slots, three are held."""
    db = tmp_path_factory.mktemp("flow") / "troth.db"
    with running_server(Settings(store="sqlite", db=str(db), access_log=False)) as server:
        r = server.client.post("/ops/limits/set", json={"group": "payments", "concurrency": 2})
        assert r.status_code == 200, r.text
        target = {"resonate:target": "poll://any@payments"}
        for i in range(5):
            server.ok("promise.create", {"id": f"pay{i}", "timeoutAt": FAR, "tags": target})
        return scrape(server)


@pytest.mark.timeout(60)
def test_every_metric_the_dashboard_and_the_rules_use_is_exposed(
    exposition: str, flow_exposition: str
) -> None:
    have = exposed(exposition) | exposed(flow_exposition) | PROMETHEUS_OWN
    for where, exprs in (("dashboard", dashboard_exprs()), ("alert rules", rule_exprs())):
        for expr in exprs:
            missing = metric_names(expr) - have
            assert not missing, f"{where}: {expr!r} reads {missing}, not in /metrics"
    text = exposition
    assert re.search(r'^troth_outbox_rows\{state="completed"\} [1-9]', text, re.M), text
    assert re.search(r"^troth_cluster_nodes_alive 1$", text, re.M), text
    assert re.search(r"^troth_task_backoffs_total [1-9]", text, re.M), text
    for line in (
        'troth_limit_concurrency{group="payments"} 2',
        'troth_limit_in_use{group="payments"} 2',
        'troth_limit_held{group="payments"} 3',
    ):
        assert re.search(f"^{re.escape(line)}$", flow_exposition, re.M), flow_exposition
    assert "troth_limit_" not in exposition  # no limit: no series, no header


@needs_promtool
@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", ["exposition", "flow_exposition"])
def test_the_exposition_passes_promtool(which: str, request: pytest.FixtureRequest) -> None:
    assert PROMTOOL is not None
    r = subprocess.run(
        [PROMTOOL, "check", "metrics"],
        input=request.getfixturevalue(which),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and not r.stdout.strip(), r.stdout + r.stderr


@needs_promtool
def test_the_retention_alert_fires_only_while_it_loses_ground(tmp_path: Path) -> None:
    """``promtool test rules``: behind an hour and growing for half an hour fires;
    behind as much but catching up does not."""
    description = folded_description("TrothRetentionFallingBehind")
    promtool_test_rules(
        tmp_path,
        f"""    input_series:
      - series: 'troth_retention_behind_seconds{{job="t", instance="a"}}'
        values: '3600+60x90'
      - series: 'troth_retention_behind_seconds{{job="t", instance="b"}}'
        values: '9000-60x90'
    alert_rule_test:
      - eval_time: 80m
        alertname: TrothRetentionFallingBehind
        exp_alerts:
          - exp_labels: {{job: t, instance: a, severity: warning}}
            exp_annotations:
              summary: "troth a: retention is 2h 20m 0s behind and losing ground"
              description: {json.dumps(description)}
""",
    )


@needs_promtool
def test_the_limit_alert_fires_only_for_a_group_held_at_its_full_limit(tmp_path: Path) -> None:
    """``promtool test rules``: group ``pay``, its 5 slots in use with tasks held from
    the start, fires after 10 minutes, once for the job though both nodes report it
    (the counts are the shared store's); ``ship`` is full and holds tasks from minute
    13, so fires at 23 and not at 21; ``mail`` has tasks held but a slot free,
    ``batch`` is full with none held: neither fires."""
    template = folded_description("TrothLimitHeldTooLong")

    def fired(group: str, held: int) -> str:
        description = template.replace('{{ $value | printf "%.0f" }}', str(held))
        description = description.replace("{{ $labels.group }}", group)
        summary = f"troth t: worker group {group} at its concurrency limit with tasks held"
        return f"""
          - exp_labels: {{job: t, group: {group}, severity: warning}}
            exp_annotations:
              summary: {json.dumps(summary)}
              description: {json.dumps(description)}"""

    series = []
    for instance in ("a", "b"):
        for group, concurrency, in_use, held in (
            ("pay", "5x30", "5x30", "37x30"),
            ("ship", "1x30", "1x30", "0x12 2x17"),
            ("mail", "4x30", "3x30", "9x30"),
            ("batch", "2x30", "2x30", "0x30"),
        ):
            labels = f'job="t", instance="{instance}", group="{group}"'
            for name, values in (
                ("troth_limit_concurrency", concurrency),
                ("troth_limit_in_use", in_use),
                ("troth_limit_held", held),
            ):
                series.append(f"      - series: '{name}{{{labels}}}'\n        values: '{values}'")
    input_series = "\n".join(series)
    promtool_test_rules(
        tmp_path,
        f"""    input_series:
{input_series}
    alert_rule_test:
      - eval_time: 9m
        alertname: TrothLimitHeldTooLong
        exp_alerts: []
      - eval_time: 21m
        alertname: TrothLimitHeldTooLong
        exp_alerts:{fired("pay", 37)}
      - eval_time: 24m
        alertname: TrothLimitHeldTooLong
        exp_alerts:{fired("pay", 37)}{fired("ship", 2)}
""",
    )


@needs_promtool
def test_the_horizon_alert_fires_for_an_hour_long_holder_not_for_a_short_backup(
    tmp_path: Path,
) -> None:
    """``promtool test rules``: a session of job ``t`` idle in transaction from minute
    0 holds the horizon an hour at minute 60, and the alert fires five minutes later
    (once for the job, though both nodes report it); job ``u``'s 40-minute backups
    never fire it."""
    description = folded_description("TrothPostgresHorizonHeld")
    promtool_test_rules(
        tmp_path,
        f"""    input_series:
      - series: 'troth_postgres_horizon_age_seconds{{job="t", instance="a"}}'
        values: '0+60x90'
      - series: 'troth_postgres_horizon_age_seconds{{job="t", instance="b"}}'
        values: '0+60x90'
      - series: 'troth_postgres_horizon_age_seconds{{job="u", instance="c"}}'
        values: '0+60x40 0x9 0+60x40'
    alert_rule_test:
      - eval_time: 64m
        alertname: TrothPostgresHorizonHeld
        exp_alerts: []
      - eval_time: 66m
        alertname: TrothPostgresHorizonHeld
        exp_alerts:
          - exp_labels: {{job: t, severity: warning}}
            exp_annotations:
              summary: "troth t: PostgreSQL's horizon held back for 1h 6m 0s"
              description: {json.dumps(description)}
""",
    )
