"""trainer.lr_warmup_steps: RL's learning rate rises linearly over the AdamW state's first steps,
the weights really move by the smaller step, a resumed trainer goes on with the schedule where
its checkpoint's state left off, and the supervised warm-up keeps its own learning rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_core.config.load import load_config
from agent_core.run import trainers
from tests.integration.test_lora import rows

LR = 1e-2


def _trainer(model: Path, *extra: str):
    cfg = load_config("smoke", [f"model.path={model}", f"trainer.learning_rate={LR}", *extra])
    return trainers.build_trainer(cfg, model, None), cfg


def _largest_move(trainer, update) -> tuple[float, float]:
    """The update's logged learning rate and the most it moved any weight."""
    before = {k: v.clone() for k, v in trainer.engine.module.state_dict().items()}
    metrics = update()
    after = trainer.engine.module.state_dict()
    moved = max((after[k] - before[k]).abs().max().item() for k in before)
    return metrics.lr, moved


def test_the_learning_rate_rises_over_the_first_steps_and_resumes(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    trainer, cfg = _trainer(tiny_model_dir, "trainer.lr_warmup_steps=4")
    # 8 rows, mini-batches of 16: one optimizer step per update
    lr, moved = _largest_move(trainer, lambda: trainer.update(rows(), iteration=1))
    assert lr == pytest.approx(LR / 4)
    # fresh AdamW's first step is lr * m / (sqrt(v) + eps) = lr * sign(g) where g is not tiny
    assert LR / 4 * 0.99 < moved <= LR / 4 * 1.0001, moved
    assert trainer.update(rows(), iteration=2).lr == pytest.approx(LR / 2)
    folder = tmp_path / "ck"
    trainer.save(folder, {"iteration": 2})
    resumed = trainers.build_trainer(cfg, folder, None)
    assert [resumed.update(rows(), iteration=i).lr for i in (3, 4, 5)] == pytest.approx(
        [LR * 3 / 4, LR, LR]
    )


def test_without_warmup_every_step_takes_the_learning_rate(tiny_model_dir: Path) -> None:
    trainer, _ = _trainer(tiny_model_dir)
    lr, moved = _largest_move(trainer, lambda: trainer.update(rows(), iteration=1))
    assert lr == LR and LR * 0.99 < moved <= LR * 1.0001, moved


def test_the_supervised_warmup_keeps_its_own_learning_rate(tiny_model_dir: Path) -> None:
    trainer, _ = _trainer(tiny_model_dir, "trainer.lr_warmup_steps=100")
    lr, moved = _largest_move(trainer, lambda: trainer.sft_update(rows(), 1, 1e-3))
    assert lr == 1e-3 and 1e-3 * 0.99 < moved <= 1e-3 * 1.0001, moved
    # RL after it: the AdamW state has taken one step, so RL's first is its second
    assert trainer.update(rows(), iteration=1).lr == pytest.approx(LR * 2 / 100)
