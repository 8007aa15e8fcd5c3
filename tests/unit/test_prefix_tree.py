"""Prefix-tree micro-batches (`trainer.shared_prefix`): a micro-batch's sequences merged into one
tree with a tree attention mask give the same loss, diagnostics, gradients, recomputed
log-probs, values and updated weights as left-padded rows, while processing each shared prefix
(system prompt, a group's task, a trajectory's earlier steps, identical responses) once."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from agent_core.algorithms.losses import AGG_MODES
from agent_core.trainer.batching import (
    TrainRow,
    build_sequences,
    collate,
    collate_tree,
    plan_minibatches,
    trajectory_mass,
    tree_microbatches,
    with_trajectory_tokens,
)
from agent_core.trainer.policy_trainer import PolicyTrainer
from configs.trainer import TrainerSection

VOCAB = 256  # the byte tokenizer's byte tokens


def _rows(seed: int) -> list[TrainRow]:
    """Three groups of 3 trajectories under one system prompt: each group shares its task,
    trajectories have 1-2 append-only steps, one response is repeated verbatim in a group."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    system = [rng.randrange(VOCAB) for _ in range(10)]
    rows = []
    for g in range(3):
        task = system + [rng.randrange(VOCAB) for _ in range(4)]
        first = [rng.randrange(VOCAB) for _ in range(3)]
        for k in range(3):
            prompt = list(task)
            for step in range(1 + (k + g) % 2):
                if step == 0 and k < 2:
                    response = list(first)  # the same sampled reply twice in a group
                else:
                    response = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 5))]
                old = (-5.6 + 0.3 * torch.randn(len(response), generator=gen)).tolist()
                adv, ret = torch.randn(2, generator=gen).tolist()
                rows.append(TrainRow(list(prompt), response, old, adv, ret, 0.1, f"{g}-{k}", step))
                prompt = prompt + response + [rng.randrange(VOCAB) for _ in range(2)]
    random.Random(seed + 1).shuffle(rows)
    return rows


def test_tree_holds_each_distinct_prefix_once() -> None:
    rows = _rows(0)
    sequences, _ = build_sequences(rows, pack=False)
    batch, _ = collate_tree(sequences, rows)
    prefixes = {tuple(s.input_ids[: n + 1]) for s in sequences for n in range(len(s.input_ids))}
    assert batch.input_ids.shape == (1, len(prefixes))
    assert batch.input_ids.shape[1] < sum(len(s.input_ids) for s in sequences) / 3
    mask = batch.attention_mask[0, 0]
    assert mask.diagonal().all() and not mask.triu(1).any()  # causal within the tree
    # a position attends to exactly its depth + 1 ancestors (itself included)
    assert torch.equal(mask.sum(-1), batch.position_ids[0] + 1)
    assert batch.response_tokens == sum(len(r.response_ids) for r in rows)


def test_tree_microbatches_respect_the_budget_and_keep_neighbours() -> None:
    rng = random.Random(3)
    tokens = [[1, 2, 3] + [rng.randrange(9) for _ in range(rng.randint(1, 6))] for _ in range(20)]
    tokens.append(list(range(40)))  # longer than the budget: a micro-batch of its own
    micros = tree_microbatches(tokens, list(range(len(tokens))), max_sequences=5, token_budget=16)
    assert sorted(i for m in micros for i in m) == list(range(len(tokens)))
    for micro in micros:
        prefixes = {tuple(tokens[i][: n + 1]) for i in micro for n in range(len(tokens[i]))}
        assert len(micro) <= 5 and (len(prefixes) <= 16 or micro == [20])
    plan = plan_minibatches(tokens, 8, 5, seed=0, tree_tokens=16)
    assert sorted(i for mini in plan for m in mini for i in m) == list(range(len(tokens)))
    assert all(sum(len(m) for m in mini) <= 8 for mini in plan)


@pytest.fixture(scope="module")
def trainer(tiny_model_dir: Path) -> PolicyTrainer:
    """Every loss term that reads per-token or per-step structure switched on."""
    cfg = TrainerSection(
        dtype="float32",
        value_head=True,
        kl_loss_coef=0.1,
        entropy_coef=0.01,
        clip_ratio_c=3.0,
        kl_clamp=10.0,
    )
    trainer = PolicyTrainer(
        tiny_model_dir, cfg, temperature=0.7, seed=0, reference_path=tiny_model_dir
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # away from the reference: KL and its gradient are not 0
        for param in trainer.engine.module.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=gen))
        trainer.engine.module.value_head.weight.normal_(0.0, 0.5, generator=gen)
    return trainer


def _loss_and_grads(trainer: PolicyTrainer, rows: list[TrainRow], tree: bool, pack: bool):
    rows = with_trajectory_tokens(rows)
    sequences, _ = build_sequences(rows, pack)
    token_count = sum(e - s for q in sequences for _, s, e in q.spans)
    step_count = sum(len(q.spans) for q in sequences)
    traj_count = trajectory_mass(rows, range(len(rows)))
    trainer.engine.zero_grad()
    total, parts = 0.0, {}
    for start in range(0, len(sequences), 4):
        seqs = sequences[start : start + 4]
        pad = trainer.train_engine.pad_id
        batch = collate_tree(seqs, rows)[0] if tree else collate(seqs, rows, pad)
        out = trainer.policy_loss.backward(batch, token_count, step_count, 1.0, traj_count)
        total += out["loss"]
        for key in ("clip_fraction", "approx_kl", "kl_ref", "value_loss"):
            parts[key] = parts.get(key, 0.0) + out[key]
    grads = [p.grad.detach().clone() for p in trainer.engine.module.parameters()]
    trainer.engine.zero_grad()
    return total, parts, grads


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("pack", [False, True])
def test_tree_equals_padded_loss_and_gradients(
    trainer: PolicyTrainer, mode: str, pack: bool
) -> None:
    trainer.cfg = trainer.cfg.model_copy(update={"loss_agg_mode": mode})
    rows = _rows(1)
    padded_loss, padded_parts, padded_grads = _loss_and_grads(trainer, rows, False, pack)
    tree_loss, tree_parts, tree_grads = _loss_and_grads(trainer, rows, True, pack)
    assert tree_loss == pytest.approx(padded_loss, abs=1e-5)
    assert tree_parts == pytest.approx(padded_parts, abs=1e-5)
    for tree, padded in zip(tree_grads, padded_grads, strict=True):
        torch.testing.assert_close(tree, padded, rtol=0, atol=1e-5)
    assert all(g.abs().max() > 1e-4 for g in padded_grads)  # every parameter is checked


def test_per_step_forwards_match(trainer: PolicyTrainer) -> None:
    """Recomputed old log-probs, values and reference KL: tree micro-batches = padded ones."""
    rows = _rows(2)
    results = {}
    for tree in (None, 24):
        trainer.train_engine.tree = tree
        logps, values = trainer.forwards.per_step(trainer.engine.module, rows, with_values=True)
        results[tree] = (logps, values, trainer.reference_kl(rows))
    trainer.train_engine.tree = trainer.cfg.micro_batch_tokens
    (lp_pad, v_pad, kl_pad), (lp_tree, v_tree, kl_tree) = results[None], results[24]
    for a, b in zip(lp_pad, lp_tree, strict=True):
        assert a == pytest.approx(b, abs=1e-5) and len(a) > 0
    assert v_tree == pytest.approx(v_pad, abs=1e-5)
    assert kl_tree == pytest.approx(kl_pad, abs=1e-5)


def test_update_with_tree_gives_the_same_weights(tiny_model_dir: Path) -> None:
    """Two full updates (two mini-batches, optimizer steps) from the same start."""
    rows = _rows(4)
    weights = {}
    for shared in (False, True):
        cfg = TrainerSection(
            dtype="float32",
            shared_prefix=shared,
            micro_batch_size=4,
            mini_batch_size=8,
            learning_rate=1e-3,
        )
        trainer = PolicyTrainer(tiny_model_dir, cfg, temperature=1.0, seed=0)
        before = {k: v.clone() for k, v in trainer.lm_state_dict().items()}
        metrics = trainer.update(rows, iteration=1)
        assert metrics.optimizer_steps == 2 and metrics.trained_tokens == sum(
            len(r.response_ids) for r in rows
        )
        weights[shared] = trainer.lm_state_dict()
        assert any(not torch.equal(before[k], v) for k, v in weights[shared].items())
    for key, value in weights[True].items():
        torch.testing.assert_close(value, weights[False][key], rtol=0, atol=1e-5)
