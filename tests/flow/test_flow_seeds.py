"""Limits seeded at start by the ``flow_limits`` setting (flag, environment or a
``[flow_limits]`` table of troth.toml): set on groups that have none in the store, a
limit changed since with ``troth limits`` kept as changed across restarts; a setting
that does not read stops the start with a message saying which entry is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers.support import running_server
from troth.flow.limits import Limit, parse_limits
from troth.server.config import ConfigError, Settings, load


def listed(url_client: Any) -> dict[str, dict[str, Any]]:
    r = url_client.get("/ops/limits")
    assert r.status_code == 200, r.text
    return {x["group"]: x for x in r.json()["limits"]}


def test_the_setting_reads_groups_and_their_caps() -> None:
    assert parse_limits("") == []
    assert parse_limits("payments:concurrency=5; llm:rate=600/m,burst=4,concurrency=2;") == [
        Limit("payments", 5),
        Limit("llm", 2, 10.0, 4),
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("payments", "is not GROUP:concurrency=N"),
        ("payments:size=3", "use concurrency=, rate=, burst="),
        ("payments:concurrency=many", "is not an integer"),
        ("payments:burst=3", "burst goes with a rate"),
        ("payments:", "needs a concurrency, a rate, a per-key"),
        ("Payments:concurrency=3", "lower case"),
        ("a:concurrency=1;a:rate=1/s", "given twice"),
    ],
)
def test_a_setting_that_does_not_read_stops_the_start(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Settings(store="memory", flow_limits=text)


def test_troth_toml_takes_a_table(tmp_path: Path) -> None:
    toml = tmp_path / "troth.toml"
    toml.write_text(
        'store = "memory"\n'
        "[flow_limits]\n"
        "payments = { concurrency = 5 }\n"
        'llm = { rate = "10/s", burst = 3 }\n',
        encoding="utf-8",
    )
    settings = load(toml_path=str(toml), environ={})
    assert parse_limits(settings.flow_limits) == [Limit("payments", 5), Limit("llm", None, 10.0, 3)]
    toml.write_text("[flow_limits]\npayments = 5\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="flow_limits: payments = "):
        load(toml_path=str(toml), environ={})


def test_seeds_fill_groups_without_a_limit_and_keep_changed_ones(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "seed.db"), flow_limits="fc:concurrency=2;llm:rate=5/s")
    with running_server(settings) as s:
        found = listed(s.client)
        assert (found["fc"]["concurrency"], found["llm"]["rate"]) == (2, 5.0)
        assert "fc" in s.app.engine.flow.limits and "llm" in s.app.engine.flow.limits
        # Created now, the third task of fc is held by the seeded limit.
        for i in range(3):
            tags = {"resonate:target": "poll://any@fc"}
            s.ok("promise.create", {"id": f"t{i}", "timeoutAt": 10**13, "tags": tags})
        assert listed(s.client)["fc"]["held"] == 1
        r = s.client.post("/ops/limits/set", json={"group": "fc", "concurrency": 3})
        assert r.status_code == 200, r.text
        r = s.client.post("/ops/limits/delete", json={"group": "llm"})
        assert r.status_code == 200, r.text
    # Restarted with the same setting: fc keeps the operator's 3; llm, deleted since,
    # has none in the store and is seeded again.
    with running_server(settings) as s:
        found = listed(s.client)
        assert found["fc"]["concurrency"] == 3
        assert found["llm"]["rate"] == 5.0
        assert found["fc"]["inUse"] == 3 and found["fc"]["held"] == 0
