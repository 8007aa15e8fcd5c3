"""Cold-start demonstrations: every env's solver wins through the real loop, and demo files
in steprl's step schema are read with failed trajectories skipped."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from agent_core.envs import CalculatorEnv, NumberLineEnv
from agent_core.prompting.renderer import AgentFlow
from agent_core.replay import steps_to_table
from agent_core.rewards.scoring import group_trajectories
from agent_core.rollout.engine import SamplingParams
from agent_core.rollout.loop import AgentEnvLoop, RolloutMeta
from agent_core.run.warmup import file_rows
from agent_core.tools.calculator import evaluate

META = RolloutMeta("r", 0, 0, "x")


@pytest.mark.parametrize("env_cls", [CalculatorEnv, NumberLineEnv])
def test_solver_demonstrations_succeed(env_cls, tiny_tokenizer) -> None:
    loop = AgentEnvLoop(
        None, AgentFlow(tiny_tokenizer), partial(env_cls, max_steps=8), SamplingParams(), 100_000
    )
    tasks = [env_cls.make_task(seed) for seed in range(40)]
    steps, stats = loop.run(tasks, 1, META, solver=True)
    trajectories = list(group_trajectories(steps).values())
    assert len(trajectories) == 40 and stats.generate_calls > 0
    assert all(t[-1].success for t in trajectories)
    for step in steps:  # a demo is recorded like a sample: ids ending with EOS, zero log-probs
        assert step.response_ids[-1] == tiny_tokenizer.eos_token_id
        assert len(step.response_logprobs) == len(step.response_ids)


def test_calculator_expressions_compute_the_answer() -> None:
    for seed in range(300):
        task = CalculatorEnv.make_task(seed)
        assert evaluate(task.meta["expression"]) == task.answer


def test_file_rows_skip_failed_trajectories(tmp_path: Path, tiny_tokenizer) -> None:
    loop = AgentEnvLoop(None, AgentFlow(tiny_tokenizer), CalculatorEnv, SamplingParams(), 100_000)
    steps, _ = loop.run([CalculatorEnv.make_task(s) for s in range(4)], 1, META, solver=True)
    failed = [s for s in steps if s.task_id == steps[0].task_id]
    for s in failed:
        s.success = False
    path = tmp_path / "demos.parquet"
    import pyarrow.parquet as pq

    pq.write_table(steps_to_table(steps), path)
    rows, _, _ = file_rows(str(path))
    assert len(rows) == len(steps) - len(failed)
    assert {r.trajectory_id for r in rows}.isdisjoint({s.trajectory_id for s in failed})
    assert all(len(r.old_logprobs) == len(r.response_ids) for r in rows)
