"""Every bench in bench/ still runs: each one's --smoke mode (a tiny random model from a config,
tiny sizes) in a subprocess, which must exit 0, print its figures and, with --record, write them
as a results record. Timings are not checked."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_core.core.measurements import read_measurement
from tests.conftest import REPO

# bench -> lines its output must hold (its figures' labels)
EXPECTED = {
    "packing": ["tok packed", "time ratio"],
    "baselines": ["random moves", "best constant move", "the solver 1.000"],
    "vision_read": ["held-out cell accuracy, linear probe", "held-out move accuracy"],
    "replay": ["steprl write total", "scan_steps(run).collect()", "bytes per step on disk"],
    "update": ["DeepSpeed PolicyTrainer overhead vs plain torch:", "trained tokens/s"],
    "dtype": ["trainer.dtype auto resolves to:", "update seconds, best of 1, float32"],
    "demonstrations": ["without the term", "whole episodes", "term seconds per row"],
    "update_drift": ["the run's own settings", "trainer.mini_batch_size=8", "1-p grew", "x time"],
    "rollout": ["== steprl engine", "== roofline", "== ablations", "sampling 4 x 512"],
    "prefix_cache": ["== full history", "== window of 1 turn", "from the cache", "on / off:"],
    "memory": ["highest peak:", "update ", "log ", "by trainer.optimizer_state"],
    "overhead": ["outside phase bodies:", "the log body:"],
    "vs_trl": ["speed-up steprl vs TRL"],
    "trees": ["== chain", "== tree", "tree arm: token budget per task", "tree / chain, tokens"],
    "teams": [
        "== shared",
        "== roles",
        "solver alone (first answer), roles",
        "roles / shared, seconds per iteration",
        "per role, trained state",
    ],
    "lora_rows": [
        "adapter per row, slice",
        "adapter per row, stack",
        "one call per role",
        "memory:",
    ],
    "scale": ["peak RSS MB per process kind", "cost model"],
    "serve": ["server req/s", "server/engine =", "time to first token", "beside/alone"],
    "async": [
        "wall seconds per iteration",
        "overlap achieved",
        "staleness of the committed rows",
        "importance weights",
        "held-out success",
        "cost model, this box",
        "predicted steady-state iteration on k GPUs",
        "timeline:",
    ],
}
# engines, trainers, flows
HEAVY = {
    "update",
    "dtype",
    "update_drift",
    "demonstrations",
    "rollout",
    "prefix_cache",
    "memory",
    "overhead",
    "vs_trl",
    "scale",
    "serve",
    "async",
    "trees",
    "lora_rows",
    "teams",
}


def test_every_bench_has_a_smoke_test() -> None:
    assert {p.stem for p in (REPO / "bench").glob("*.py")} - {"offline"} == set(EXPECTED)


@pytest.fixture(scope="module")
def bench_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The benches' temp folder (TMPDIR): their tiny model is built once into it."""
    return tmp_path_factory.mktemp("bench")


@pytest.mark.parametrize(
    "bench",
    [pytest.param(b, marks=pytest.mark.slow) if b in HEAVY else b for b in EXPECTED],
)
def test_bench_smoke_prints_its_figures(bench: str, bench_tmp: Path, tmp_path: Path) -> None:
    if bench == "vs_trl" and importlib.util.find_spec("trl") is None:
        pytest.skip("bench/vs_trl.py needs TRL: pip install -e '.[bench]'")
    env = os.environ | {"TMPDIR": str(bench_tmp), "PYTHONUNBUFFERED": "1"}
    record = tmp_path / "record.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / f"{bench}.py"), "--smoke", "--record", str(record)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "skipped" not in done.stdout, done.stdout
    for label in EXPECTED[bench]:
        assert label in done.stdout, f"{bench}: no {label!r} in\n{done.stdout[-3000:]}"
    written = read_measurement(record)
    assert written.kind == "bench" and written.setting == f"bench/{bench}.py"
    assert written.label == "--smoke" and written.figures
    assert written.command == f".venv/bin/python bench/{bench}.py --smoke"
