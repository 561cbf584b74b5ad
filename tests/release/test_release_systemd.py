"""deploy/systemd/troth.service: accepted by ``systemd-analyze verify`` without a
single complaint, and hardened as docs/install.md says."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.install import ROOT

UNIT = ROOT / "deploy" / "systemd" / "troth.service"


def directives(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_the_unit_is_hardened_and_keeps_its_database_in_its_state_directory() -> None:
    unit = directives(UNIT.read_text())
    one = {key: values[-1] for key, values in unit.items()}
    assert one["DynamicUser"] == "yes" or one.get("User") not in (None, "", "root", "0")
    for key, value in {
        "ProtectSystem": "strict",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "StateDirectory": "troth",
        "Restart": "on-failure",
        "KillSignal": "SIGTERM",
        "CapabilityBoundingSet": "",
    }.items():
        assert one.get(key) == value, key
    assert "TROTH_DB=%S/troth/troth.db" in unit["Environment"]
    assert one["EnvironmentFile"].startswith("-/etc/")
    assert one["ExecStart"].endswith("/bin/troth serve")


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is missing: apt-get install systemd",
)
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    """Verified as installed: ExecStart points at a troth that exists here (this venv's),
    since verify rightly refuses a unit whose binary is missing. Unknown keys and bad
    values are only warnings to verify, so its output must be empty too."""
    troth = Path(sys.executable).parent / "troth"
    assert troth.exists()
    text = UNIT.read_text()
    assert "ExecStart=/opt/troth/bin/troth serve" in text
    copy = tmp_path / "troth.service"
    copy.write_text(text.replace("/opt/troth/bin/troth", str(troth)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stderr
