"""deploy/compose.yaml: two troth nodes of the image on one PostgreSQL, started once
it is ready, each with a name of its own, NATS only when asked for."""

from __future__ import annotations

from typing import Any

import yaml

from helpers.install import ROOT

COMPOSE = ROOT / "deploy" / "compose.yaml"


def test_two_nodes_of_the_image_share_one_postgres() -> None:
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    nodes = {name: s for name, s in services.items() if name.startswith("troth-")}
    assert len(nodes) == 2
    for node in nodes.values():
        build = node["build"]
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).is_file()
        assert node["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert node["environment"]["TROTH_STORE"] == "postgres"
    envs = [n["environment"] for n in nodes.values()]
    assert len({e["TROTH_POSTGRES_URL"] for e in envs}) == 1
    assert len({e["TROTH_NODE_ID"] for e in envs}) == 2
    assert len({p for n in nodes.values() for p in n["ports"]}) == 2
    assert services["postgres"]["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert services["nats"]["profiles"] == ["nats"]
