"""The DeepSpeed update of a VLM policy, with a tiny random VLM built in code: the trainer's
forward takes each row's pixel values (its recomputed log-probs are the rollout's), an update's
gradient reaches the projector while the vision encoder stays frozen (trainable by a flag),
LoRA adapts the language model only, and a checkpoint is an image-text-to-text folder that
carries its processor."""

from __future__ import annotations

import itertools
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoProcessor

from agent_core.core.images import ImageBag
from agent_core.models import is_vision_folder
from agent_core.prompting.renderer import PromptRenderer
from agent_core.rollout.engines.hf import HFRolloutEngine
from agent_core.rollout.loop import AgentEnvLoop
from agent_core.trainer.batching import TrainRow, build_sequences, collate_tree, tree_keys
from agent_core.trainer.policy_trainer import PolicyTrainer
from configs.trainer import TrainerSection
from tests.unit.test_vision_rollout import META, SAMPLING, ShowColors

FAST = {"dtype": "float32", "micro_batch_size": 4, "mini_batch_size": 64, "learning_rate": 1e-2}


@pytest.fixture(scope="module")
def rows(tiny_vlm_dir: Path) -> list[TrainRow]:
    """Two 3-step ShowColors episodes (full history: append-only, nested images) as rows with
    advantages of both signs."""
    engine = HFRolloutEngine(tiny_vlm_dir, threads=1)
    shown = ImageBag()
    flow = PromptRenderer(engine.tokenizer, "none", engine.processor)
    env = partial(ShowColors, max_steps=3)
    loop = AgentEnvLoop(engine, flow, env, SAMPLING, 10_000, images=shown)
    steps, _ = loop.run([ShowColors.make_task(0)], 2, META)
    return [
        TrainRow(
            s.prompt_ids, s.response_ids, s.response_logprobs, 1.0 if i % 2 else -1.0,
            trajectory_id=s.trajectory_id, step_index=s.step_index,
            images=tuple(shown.images[h] for h in s.image_hashes),
        )
        for i, s in enumerate(steps)
    ]  # fmt: skip


def _weights(trainer: PolicyTrainer, part: str) -> dict[str, torch.Tensor]:
    return {
        name: param.detach().clone()
        for name, param in trainer.engine.module.named_parameters()
        if part in name
    }


def test_the_trainer_recomputes_the_rollouts_logprobs_with_its_images(rows, tiny_vlm_dir):
    trainer = PolicyTrainer(tiny_vlm_dir, TrainerSection(**FAST), temperature=1.0, seed=0)
    assert max(abs(r) for r in trainer.log_ratios(rows)) < 1e-4
    sequences, packed = build_sequences(rows, pack=True)
    assert packed == 2 and len(sequences) == 2  # each episode is one forward with its images
    assert trainer.train_engine.tree is not None  # prefix trees tell pictures apart


def _recolored(row: TrainRow, color: tuple[int, int, int]) -> TrainRow:
    """`row` with its last picture painted `color`: the same prompt ids, another picture."""
    last = Image.new(row.images[-1].mode, row.images[-1].size, color)
    return replace(row, images=(*row.images[:-1], last))


def test_a_prefix_tree_tells_equal_image_tokens_apart(rows, tiny_vlm_dir):
    """Rows whose prompt ids are equal but whose last picture differs share their prompt's text
    in the tree, not their pictures: the tree's log-probs are the left-padded batch's (where a
    tree merged on token ids alone would give the twins the first twin's picture)."""
    trainer = PolicyTrainer(tiny_vlm_dir, TrainerSection(**FAST), temperature=1.0, seed=0)
    engine = trainer.train_engine
    base = [r for r in rows if r.step_index == 2]
    twins = base + [_recolored(r, (255, 0, 255)) for r in base] + [_recolored(base[0], (0, 0, 0))]
    sequences, _ = build_sequences(twins, pack=False)
    keys = engine.tree_keys(sequences, twins)
    tree, pictures = collate_tree(sequences, twins, keys)
    assert len({tuple(r.prompt_ids) for r in twins}) == len(base)  # equal ids...
    shown = {tuple(_pixels(i) for i in r.images[:k]) for r in twins for k in range(1, 4)}
    assert len(pictures) == len(shown)  # ...each picture once after each distinct prefix
    assert tree.input_ids.shape[1] < sum(len(s.input_ids) for s in sequences) / 2
    by_tree = trainer.forwards.policy_logprobs(twins)
    engine.tree = None
    padded = trainer.forwards.policy_logprobs(twins)
    for a, b in zip(by_tree, padded, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    assert max(abs(x - y) for x, y in zip(padded[0], padded[len(base)], strict=True)) > 1e-3
    for wrong in ([], [*twins[0].images, *twins[1].images[:2]]):  # 0 or 5 pictures, not 3
        with pytest.raises(ValueError, match="shared_prefix=false"):
            tree_keys(sequences[:1], [wrong], engine.image_token)


def _pixels(image: Image.Image) -> bytes:
    return image.tobytes()


def test_an_update_trains_the_projector_not_the_frozen_vision_tower(rows, tiny_vlm_dir):
    trainer = PolicyTrainer(tiny_vlm_dir, TrainerSection(**FAST), temperature=1.0, seed=0)
    before = {p: _weights(trainer, p) for p in ("projector", "vision_tower", "language_model")}
    metrics = trainer.update(rows, 1)
    assert metrics.optimizer_steps == 1
    for part, moved in (("projector", True), ("vision_tower", False), ("language_model", True)):
        after = _weights(trainer, part)
        changed = [n for n in after if not torch.equal(after[n], before[part][n])]
        assert bool(changed) == moved, part
    flagged = TrainerSection(**FAST, train_vision_tower=True)
    trainer = PolicyTrainer(tiny_vlm_dir, flagged, temperature=1.0, seed=0)
    tower = _weights(trainer, "vision_tower")
    trainer.update(rows, 1)
    assert any(not torch.equal(v, tower[n]) for n, v in _weights(trainer, "vision_tower").items())


def test_lora_adapts_the_language_model_and_trains_the_projector(rows, tiny_vlm_dir, tmp_path):
    cfg = TrainerSection(**FAST, lora={"r": 4, "alpha": 8})
    trainer = PolicyTrainer(tiny_vlm_dir, cfg, temperature=1.0, seed=0)
    trainable = [n for n, p in trainer.engine.module.named_parameters() if p.requires_grad]
    assert any("lora_" in n and "language_model" in n for n in trainable)
    assert not any("vision_tower" in n for n in trainable)
    assert any("multi_modal_projector" in n for n in trainable)
    trainer.update(rows, 1)
    merged = trainer.lm_state_dict()
    engine = HFRolloutEngine(tiny_vlm_dir, threads=1)
    engine.load_weights(merged, 1)  # the merged weights are the rollout engine's own names
    assert set(merged) == set(engine.model.state_dict())
    saved = trainer.save(tmp_path / "ckpt", {"iteration": 1})
    assert is_vision_folder(saved) and (saved / "adapter").is_dir()


def test_a_checkpoint_is_a_vlm_folder_with_its_processor(rows, tiny_vlm_dir, tmp_path):
    trainer = PolicyTrainer(tiny_vlm_dir, TrainerSection(**FAST), temperature=1.0, seed=0)
    trainer.update(rows, 1)
    folder = trainer.save(tmp_path / "ckpt", {"iteration": 1})
    assert is_vision_folder(folder)
    processor = AutoProcessor.from_pretrained(folder)
    assert processor.image_token == "<image>"
    engine = HFRolloutEngine(folder, threads=1)  # what serve-policy and the next rollout load
    first = [r for r in rows if r.step_index == 0][:1]
    gen = engine.generate([first[0].prompt_ids], SAMPLING, images=[list(first[0].images)])
    again = TrainRow(first[0].prompt_ids, gen[0].token_ids, gen[0].logprobs, 0.0,
                     images=first[0].images)  # fmt: skip
    reloaded = PolicyTrainer(folder, TrainerSection(**FAST), temperature=1.0, seed=0)
    assert abs(reloaded.log_ratios([again])[0]) < 1e-4
    assert list(itertools.chain(*[r.images for r in rows]))  # the rows did show images
