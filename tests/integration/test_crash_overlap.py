"""Kill -9 the training process while two iterations are in flight (overlap on: the collection of
k+1 runs while k updates), at fixed points and at a random moment, then rerun: every task the
run drew is trained on exactly once or dropped for a recorded reason, none lost, none doubled,
and the staleness bookkeeping holds, like NeMo-RL's skipped-prompt count but as an invariant.

What it compares with the uninterrupted run: the episodes (the same trajectory ids per
iteration, each with a whole, contiguous run of steps) and the per-task accounting. Not the
weights: with overlap, which policy version sampled each turn depends on when updates commit
(partial rollouts), so two runs' rows differ in version and log-probs by design.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from agent_core.collect.iteration_tasks import iteration_tasks
from agent_core.config.load import load_config
from tests.conftest import REPO

pytestmark = pytest.mark.slow
ITERATIONS = 4
MAX_STALENESS = 1
OUTCOMES = ("trained", "stale", "zero_variance", "failed")


def _settings(root: Path, name: str) -> list[str]:
    return [
        f"run.name={name}",
        f"run.iterations={ITERATIONS}",
        f"run.output_dir={root / 'runs'}",
        f"model.path={root.parent / 'tiny-model'}",
        f"tracking.tracking_uri=sqlite:///{root / 'mlflow.db'}",
        "env.name=numberline",
        "env.max_steps=3",
        f"overlap.max_staleness={MAX_STALENESS}",
        "trainer.off_policy_correction=decoupled",
        "trainer.old_logprobs=recompute",
        "trainer.keep_checkpoints=1",
    ]


def _run(
    root: Path, name: str, crash_at: str | None = None, kill_after: float | None = None
) -> subprocess.CompletedProcess:
    """`steprl train` in its own process group: killed at a crash point, or SIGKILLed from
    outside after `kill_after` seconds; whatever it left behind is killed afterwards."""
    env = os.environ | {"PREFECT_HOME": str(root.parent / "prefect-home")}
    env.pop("STEPRL_CRASH_AT", None)
    if crash_at:
        env["STEPRL_CRASH_AT"] = crash_at
    cmd = [sys.executable, "-m", "flows.cli", "train", "--config", "smoke"]
    for setting in _settings(root, name):
        cmd += ["--set", setting]
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"{name}-{crash_at or kill_after or 'run'}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=out, start_new_session=True
        )
        try:
            code = proc.wait(timeout=kill_after or 600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, code, log.read_text(), "")


def _accounting(root: Path, name: str) -> dict:
    """Per iteration: trajectory ids, and each drawn task's recorded outcome; asserting on the
    way that no row is doubled or lost and no trained row is older than the bound."""
    config = load_config("smoke", _settings(root, name))
    run_dir = root / "runs" / name
    seen_groups: Counter = Counter()
    found = {}
    for k in range(1, ITERATIONS + 1):
        rows = pq.read_table(run_dir / f"iter_{k:04d}" / "steps.parquet").to_pydict()
        record = json.loads((run_dir / f"iter_{k:04d}" / "update.json").read_text())
        keys = list(zip(rows["trajectory_id"], rows["step_index"], strict=True))
        assert len(keys) == len(set(keys)), f"iteration {k}: a step row is doubled"
        steps: dict[str, list[int]] = {}
        for traj, index in keys:
            steps.setdefault(traj, []).append(index)
        for traj, indexes in steps.items():  # whole trajectories: steps 0..n-1, none missing
            assert sorted(indexes) == list(range(len(indexes))), (k, traj, indexes)
        seen_groups.update(set(rows["group_id"]))
        drawn = {t.task_id for t in iteration_tasks(config, k)}
        assert set(record["tasks"]) == drawn, k  # every drawn task has one outcome
        assert set(record["tasks"].values()) <= set(OUTCOMES)
        per_task = Counter(rows["task_id"])
        for task in drawn:  # every episode of every task is in the partition
            assert per_task[task] and len({t for t in steps if t.startswith(f"{k}:{task}:")}) == (
                config.rollout.group_size
            ), (k, task)
        ages = [k - 1 - v for v in rows["policy_version"]]
        assert min(ages) >= 0 and max(ages) <= MAX_STALENESS, (k, ages)  # wait: none dropped
        assert record["metrics"]["async/dropped_stale_rows"] == 0
        found[k] = {"trajectories": sorted(steps), "tasks": record["tasks"]}
    # each (iteration, task) group lives in exactly one partition, once
    assert all(count == 1 for count in seen_groups.values()), seen_groups
    # MLflow: one value per metric per iteration
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    for key in ("reward/mean", "actor/policy_loss", "actor/async/staleness_mean"):
        steps_logged = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps_logged == list(range(1, ITERATIONS + 1)), key
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float, dict]:
    root = tmp_path_factory.mktemp("crash-overlap") / "reference"
    start = time.monotonic()
    done = _run(root, "steady")
    assert done.returncode == 0, done.stdout[-3000:]
    return root, time.monotonic() - start, _accounting(root, "steady")


def _same_episodes(ours: dict, theirs: dict) -> None:
    for k in range(1, ITERATIONS + 1):
        assert ours[k]["trajectories"] == theirs[k]["trajectories"], k


# update:2 and checkpoint:3: the collection of the next iteration is in flight; collect:3:
# the collection thread kills the process while iteration 2 updates
@pytest.mark.parametrize("point", ["update:2", "collect:3", "checkpoint:3"])
def test_kill_while_overlapping_then_resume_losslessly(reference, point: str) -> None:
    ref_root, _, expected = reference
    root = ref_root.parent / f"crash-{point.replace(':', '-')}"
    crashed = _run(root, "crashy", crash_at=point)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-3000:]
    resumed = _run(root, "crashy")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    _same_episodes(_accounting(root, "crashy"), expected)


def test_kill_at_a_random_moment_then_resume_losslessly(reference) -> None:
    """SIGKILL from outside at an unannounced moment (the Prefect server's start-up takes the
    first ~40 % of the reference run's wall time, so the moment is drawn from the rest)."""
    ref_root, wall, expected = reference
    root = ref_root.parent / "random"
    moment = random.Random().uniform(0.5, 0.9) * wall
    print(f"killed after {moment:.1f} s of a {wall:.1f} s run")
    _run(root, "killed", kill_after=moment)
    resumed = _run(root, "killed")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    _same_episodes(_accounting(root, "killed"), expected)
