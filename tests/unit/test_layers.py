"""Layer rules of DESIGN.md §1 that a test can check."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_agent_core_imports_neither_prefect_nor_mlflow() -> None:
    code = (
        "import sys, agent_core, agent_core.run.score, agent_core.run.update, agent_core.collect.shard, agent_core.config.load, agent_core.envs; "
        "bad = [m for m in ('prefect', 'mlflow') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_only_tracking_imports_mlflow() -> None:
    offenders = []
    for path in (REPO / "agent_core").rglob("*.py"):
        text = path.read_text()
        if path.name != "tracking.py" and ("import mlflow" in text or "from mlflow" in text):
            offenders.append(str(path))
        if "import prefect" in text or "from prefect" in text:
            offenders.append(str(path))
    assert offenders == []
