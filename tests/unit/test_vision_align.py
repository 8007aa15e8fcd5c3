"""The warm-up's alignment stage (`agent_core.run.vision_align`), with the tiny random VLM built
in code: only the projector's weights and optimizer state move, the captions are what the image
shows (Sokoban's without the undrawn outer wall), the stage lifts the held-out caption tokens'
probability, and an env without images or captions is refused with the fix."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agent_core.config.load import load_config
from agent_core.envs import env_class
from agent_core.run import vision_align
from agent_core.run.warmup import align_lines
from agent_core.trainer.engine import TrainEngine
from agent_core.trainer.policy_module import PROJECTORS
from agent_core.trainer.policy_trainer import PolicyTrainer
from configs.trainer import TrainerSection

FAST = {"dtype": "float32", "micro_batch_size": 8, "mini_batch_size": 8}


def _config(tiny_vlm_dir: Path, *extra: str):
    return load_config(
        "smoke",
        [
            "env.name=frozenlake_image",
            "env.max_steps=8",
            "env.context={name: window, last_turns: 1}",
            "model.source=tiny-random-vlm",
            f"model.path={tiny_vlm_dir}",
            "warmup.align_tasks=6",
            "warmup.align_epochs=3",
            *extra,
        ],
    )


def _snapshot(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}


def _trainable(trainer: PolicyTrainer) -> set[str]:
    return {n for n, p in trainer.engine.module.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("lora", [None, {"r": 4, "alpha": 8}], ids=["full", "lora"])
def test_the_stage_trains_the_projector_alone_and_lifts_held_out_captions(tiny_vlm_dir, lora):
    cfg = _config(tiny_vlm_dir)
    settings = TrainerSection(**FAST, lora=lora)  # LoRA: the adapters wait too
    trainer = PolicyTrainer(tiny_vlm_dir, settings, temperature=1.0, seed=0)
    before, trainable = _snapshot(trainer), _trainable(trainer)
    assert any("language_model" in n for n in trainable)
    figures = vision_align.align(cfg, trainer)
    after = _snapshot(trainer)
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and all(set(n.split(".")) & set(PROJECTORS) for n in moved)
    assert not any("language_model" in n or "vision_tower" in n for n in moved)
    optimizer = trainer.engine.optimizer
    with_state = {id(p) for p in optimizer.state}
    names = {id(p): n for n, p in trainer.engine.module.named_parameters()}
    assert with_state and all(set(names[i].split(".")) & set(PROJECTORS) for i in with_state)
    # what trained before the stage trains again after it (the demonstrations' warm-up)
    assert _trainable(trainer) == trainable
    assert figures["optimizer_steps"] >= 3 and figures["rows"] >= 6
    assert figures["caption_token_prob"] > figures["caption_token_prob_base"]


def test_captions_are_what_the_image_shows():
    lake = env_class("frozenlake_image")(max_steps=8)
    lake.reset(lake.make_task(3))
    assert lake.image_caption() == lake.game.text()
    room = env_class("sokoban_image")(max_steps=8)
    room.reset(room.make_task(3))
    inside = [row[1:-1] for row in room.game.cells()[1:-1]]  # what the image draws
    symbols = {"wall": "#", "floor": "_", "target": "O", "box": "X", "player": "P"}
    symbols |= {"box_on_target": "√", "player_on_target": "S"}
    assert room.image_caption() == "\n".join(" ".join(symbols[k] for k in row) for row in inside)
    assert env_class("frozenlake")(max_steps=8).image_caption() is None


def test_images_without_captions_are_refused_and_a_text_env_skips_the_stage(
    tiny_vlm_dir, monkeypatch
):
    lake = env_class("frozenlake_image")
    monkeypatch.setattr(lake, "image_caption", lambda self: None)
    cfg = _config(tiny_vlm_dir)
    with pytest.raises(ValueError, match=r"gives no image_caption.*warmup\.align_tasks=0"):
        vision_align.align(cfg, trainer=None)
    text = _config(tiny_vlm_dir, "env.name=frozenlake")
    assert vision_align.align(text, trainer=None) == {}  # the text twin: nothing to align


def test_training_only_the_projector_needs_zero_stage_0():
    partitioned = SimpleNamespace(cfg=TrainerSection(zero_stage=1))  # refused before any weight
    refused = pytest.raises(ValueError, match=r"needs trainer\.zero_stage=0")
    with refused, TrainEngine.training_only(partitioned, PROJECTORS):
        pass


def test_no_held_out_task_leaves_out_the_held_out_figure(tiny_vlm_dir, monkeypatch):
    monkeypatch.setattr(vision_align, "eval_tasks", lambda cfg: [])
    trainer = PolicyTrainer(tiny_vlm_dir, TrainerSection(**FAST), temperature=1.0, seed=0)
    figures = vision_align.align(_config(tiny_vlm_dir, "warmup.align_epochs=1"), trainer)
    assert "caption_token_prob" not in figures and figures["optimizer_steps"] >= 1
    (line,) = align_lines(figures)
    assert "held-out" not in line and f"{figures['rows']:.0f} image captions" in line
