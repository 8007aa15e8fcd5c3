"""The local MLflow store survives the first run being killed: MLflow's sqlite schema is built
by some seventy migrations whose DDL commits one statement at a time, and a process killed in
those seconds used to leave an `mlflow.db` that every later run failed to open ("duplicate
column name"). steprl builds the store under a temp name and renames it into place."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy
from mlflow.store.db.utils import _get_latest_schema_revision
from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

from agent_core import tracking
from configs.tracking import TrackingSection
from tests.conftest import REPO

pytestmark = pytest.mark.slow

FIRST_RUN = """
import sys
from pathlib import Path
from agent_core import tracking
from configs.tracking import TrackingSection
cfg = TrackingSection(tracking_uri=sys.argv[1], experiment="t")
run_dir = Path(sys.argv[2])
run_dir.mkdir(parents=True)
run_id = tracking.start_or_resume_run(cfg, run_dir, run_dir.name, {"p": "1"}, {})
tracking.log_metrics(cfg, run_id, 1, {"reward/mean": 0.5})
"""


def _first_run(uri: str, run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", FIRST_RUN, uri, str(run_dir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _runs(db: Path) -> list[str]:
    with sqlite3.connect(db) as con:
        return sorted(row[0] for row in con.execute("SELECT name FROM runs"))


def test_a_first_run_killed_while_the_store_is_built_leaves_a_store_the_rerun_opens(
    tmp_path: Path,
) -> None:
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    proc = _first_run(uri, tmp_path / "killed")
    deadline = time.monotonic() + 120
    while not any(tmp_path.glob("*mlflow.db*")) and proc.poll() is None:
        assert time.monotonic() < deadline, "the store was never started"
        time.sleep(0.01)
    time.sleep(0.3)  # inside the migrations: building the store takes seconds
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the store was built before the kill: nothing tested"

    rerun = _first_run(uri, tmp_path / "rerun")
    out, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, out[-3000:]
    assert _runs(db) == ["rerun"]
    assert not list(tmp_path.glob(".mlflow.db.*")), "the temp store was left behind"


def test_two_first_runs_at_once_build_one_store_and_keep_both_runs(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    procs = [_first_run(f"sqlite:///{db}", tmp_path / name) for name in ("a", "b")]
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
    assert _runs(db) == ["a", "b"]


def test_a_half_built_store_is_refused_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an older steprl or another tool left when killed after MLflow created the tables and
    before its migrations ran."""
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "mlflow.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    InitialBase.metadata.create_all(engine)  # MLflow's first step, before its migrations
    engine.dispose()
    cfg = TrackingSection(tracking_uri=f"sqlite:///{db}", experiment="t")
    with pytest.raises(RuntimeError) as refused:
        tracking.client_for(cfg)
    message = str(refused.value)
    assert str(db) in message and "holds no runs" in message
    assert f"mv {db} {db}.broken" in message and _get_latest_schema_revision() in message

    os.rename(db, f"{db}.broken")  # the fix the message names
    run_id = tracking.start_or_resume_run(cfg, tmp_path / "run", "r", {}, {})
    tracking.log_metrics(cfg, run_id, 1, {"x": 1.0})
    assert _runs(db) == ["r"]


def test_a_file_that_is_not_a_database_is_named_in_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "mlflow.db"
    db.write_text("these are notes, not a database\n" * 100)
    cfg = TrackingSection(tracking_uri=f"sqlite:///{db}", experiment="t")
    with pytest.raises(RuntimeError, match="is not an sqlite database") as refused:
        tracking.client_for(cfg)
    assert str(db) in str(refused.value) and "tracking.tracking_uri" in str(refused.value)
    assert db.read_text().startswith("these are notes"), "the file must be left as it was"


def test_an_empty_file_becomes_a_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "mlflow.db"
    db.touch()
    cfg = TrackingSection(tracking_uri=f"sqlite:///{db}", experiment="t")
    tracking.start_or_resume_run(cfg, tmp_path / "run", "r", {}, {})
    assert _runs(db) == ["r"]
