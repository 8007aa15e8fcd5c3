"""The compact optimizer states (trainer.optimizer_state bfloat16 and 8bit) still learn: a short
supervised run on the tiny model ends at the loss fp32 AdamW reaches, within 2 %; and a
checkpoint resumes them exactly (`build_trainer` loads its DeepSpeed state: the same next
update)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from agent_core.config.load import load_config
from agent_core.run import trainers
from agent_core.trainer.batching import TrainRow
from tests.integration.test_lora import rows

pytestmark = pytest.mark.slow


def _demonstrations() -> list[TrainRow]:
    """16 rows whose reply is a fixed function of the prompt's first tokens."""
    rng = random.Random(0)
    out = []
    for k in range(16):
        prompt = [rng.randrange(256) for _ in range(12)]
        reply = [(p * 7 + 3) % 256 for p in prompt[:6]]
        out.append(TrainRow(prompt, reply, [0.0] * 6, 1.0, trajectory_id=str(k)))
    return out


def _trainer(model: Path, state: str):
    overrides = [f"model.path={model}", "trainer.dtype=float32", "trainer.micro_batch_size=8"]
    overrides += ["trainer.mini_batch_size=16", f"trainer.optimizer_state={state}"]
    return trainers.build_trainer(load_config("smoke", overrides), model, None)


def _learn(trainer) -> list[float]:
    return [
        trainer.sft_update(_demonstrations(), 1, learning_rate=3e-3).policy_loss for _ in range(12)
    ]


@pytest.mark.parametrize("state", ["bfloat16", "8bit"])
def test_compact_moments_learn_and_resume(tiny_model_dir: Path, tmp_path: Path, state) -> None:
    if state == "8bit":
        pytest.importorskip("torchao", reason="the optim8bit extra (.ci/run installs it last)")
    baseline = _learn(_trainer(tiny_model_dir, "float32"))
    trainer = _trainer(tiny_model_dir, state)
    losses = _learn(trainer)
    assert losses[-1] < 0.7 * losses[0]
    assert losses[-1] == pytest.approx(baseline[-1], rel=0.02)
    folder = tmp_path / "ck"
    trainer.save(folder, {"iteration": 1})
    resumed = _trainer(folder, state)
    a, b = trainer.update(rows(), iteration=2), resumed.update(rows(), iteration=2)
    assert a.policy_loss == b.policy_loss
    mine, theirs = trainer.engine.module.state_dict(), resumed.engine.module.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
