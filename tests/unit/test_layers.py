"""Layer rules of DESIGN.md §1 that a test can check."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

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


def _floors() -> list[set[str]]:
    """The agent_core floors of pyproject's layers contract, top floor first."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["name"].startswith("agent_core rooms"))
    return [{room.strip() for room in layer.split("|")} for layer in contract["layers"]]


def test_every_room_of_agent_core_sits_on_a_floor() -> None:
    """A new room (package or loose module) outside the contract would import freely."""
    rooms = {
        f"agent_core.{p.stem}"
        for p in (REPO / "agent_core").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    placed = set().union(*_floors())
    assert rooms - placed == set(), "add these rooms to a floor in pyproject.toml"
    assert placed - rooms == set(), "these floors name rooms that no longer exist"


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
    )


def test_lint_imports_refuses_a_planted_arrow_back_up(tmp_path: Path) -> None:
    """`make lint` runs lint-imports: the tree as it is passes, and one import inside a
    function from the bottom floor up to run/ fails, naming both rooms."""
    for folder in ("agent_core", "configs", "tasks", "flows"):
        shutil.copytree(
            REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    clean = _lint_imports(tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    records = tmp_path / "agent_core" / "core" / "records.py"
    planted = "\n\ndef _planted():\n    from agent_core.run import prepare\n\n    return prepare\n"
    records.write_text(records.read_text() + planted)
    broken = _lint_imports(tmp_path)
    assert broken.returncode != 0
    assert "agent_core.core.records -> agent_core.run.prepare" in broken.stdout, broken.stdout


def test_readme_file_tree_is_the_real_house() -> None:
    """The README's "Where things live" lists every room once, on the floor the layers
    contract gives it, and every top-level folder it names exists: the tree cannot go stale."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Where things live", 1)[1].split("```", 2)[1]
    floors: dict[int, set[str]] = {}
    folders = []
    for line in block.strip().splitlines():
        match = re.match(r"floor\s+(\d+)\s+agent_core/(\S+?)(\.py|/)\s", line)
        if match:
            floors.setdefault(int(match[1]), set()).add(f"agent_core.{match[2]}")
        else:
            folders.append(line.split()[0])
    contract = _floors()  # top floor first
    assert [floors[k] for k in sorted(floors, reverse=True)] == contract
    assert sorted(floors) == list(range(len(contract)))
    for folder in folders:
        assert (REPO / folder).is_dir(), f"README names {folder}, which does not exist"


def test_readme_stays_the_newcomer_path() -> None:
    """Everything past the newcomer path lives in docs/ (one page per topic)."""
    size = len((REPO / "README.md").read_bytes())
    assert size < 20_000, f"README.md is {size} bytes: move topic material to a docs/ page"
