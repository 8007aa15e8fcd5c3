"""A step's gradients in one flat buffer (`FlatGrads`): the same gradients bit for bit as
autograd's own, a weight no backward reached keeps no gradient (AdamW skips it), the buffer
goes at the step; and a trainer's updates with and without it end at the same weights."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from agent_core.config.load import load_config
from agent_core.run import trainers
from agent_core.trainer.flat_grads import FlatGrads
from tests.integration.test_lora import rows


class _TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.used = nn.Linear(16, 1)
        self.unused = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(torch.tanh(self.body(x))).sum()


def _backwards(model: nn.Module, flat: FlatGrads | None) -> None:
    torch.manual_seed(1)
    for _ in range(3):  # three micro-batches accumulate
        if flat is not None:
            flat.install()
        model(torch.randn(5, 8)).backward()


def test_flat_buffer_gives_autograds_gradients_and_leaves_unreached_weights_none() -> None:
    torch.manual_seed(0)
    plain, flat_model = _TwoHeads(), _TwoHeads()
    flat_model.load_state_dict(plain.state_dict())
    flat = FlatGrads(flat_model)
    _backwards(plain, None)
    _backwards(flat_model, flat)
    (buffer,) = flat.buffers
    assert buffer.numel() == sum(p.numel() for p in flat_model.parameters())
    flat.settle()
    for (name, mine), theirs in zip(flat_model.named_parameters(), plain.parameters(), strict=True):
        if name.startswith("unused"):
            assert mine.grad is None and theirs.grad is None
        else:
            assert mine.grad.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
            assert torch.equal(mine.grad, theirs.grad), name
    flat_model.zero_grad(set_to_none=True)
    flat.release()
    assert not flat.buffers
    flat.install()  # the next step's buffer: zeros again
    assert all(torch.count_nonzero(p.grad) == 0 for p in flat_model.parameters())


def test_frozen_weights_get_no_buffer() -> None:
    model = _TwoHeads()
    model.body.requires_grad_(False)
    flat = FlatGrads(model)
    flat.install()
    assert model.body.weight.grad is None
    assert flat.buffers[0].numel() == sum(p.numel() for p in model.used.parameters()) + sum(
        p.numel() for p in model.unused.parameters()
    )


def test_trainer_updates_with_and_without_the_buffer_end_at_the_same_weights(
    tiny_model_dir: Path,
) -> None:
    overrides = [f"model.path={tiny_model_dir}", "trainer.dtype=float32"]
    overrides += ["trainer.micro_batch_size=2", "trainer.mini_batch_size=4"]
    cfg = load_config("smoke", overrides)
    flat, plain = (trainers.build_trainer(cfg, tiny_model_dir, None) for _ in range(2))
    assert flat.train_engine.flat_grads is not None
    plain.train_engine.flat_grads = None
    for iteration in (1, 2):
        a, b = flat.update(rows(), iteration=iteration), plain.update(rows(), iteration=iteration)
        assert a.policy_loss == b.policy_loss and a.grad_norm == b.grad_norm
    mine, theirs = flat.engine.module.state_dict(), plain.engine.module.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert not flat.train_engine.flat_grads.buffers
    assert all(p.grad is None for p in flat.engine.module.parameters())


def test_a_weight_frozen_at_first_gets_its_gradient_once_it_trains() -> None:
    model = _TwoHeads()
    model.used.requires_grad_(False)
    flat = FlatGrads(model)
    flat.install()
    model(torch.randn(5, 8)).backward()
    flat.settle()
    assert model.used.weight.grad is None and model.unused.weight.grad is None
    model.zero_grad(set_to_none=True)
    flat.release()
    model.used.requires_grad_(True)
    flat.install()
    model(torch.randn(5, 8)).backward()
    flat.settle()
    assert torch.count_nonzero(model.used.weight.grad) > 0 and model.unused.weight.grad is None


def test_a_dropped_model_with_its_buffer_is_freed() -> None:
    import gc
    import weakref

    model = _TwoHeads()
    flat = FlatGrads(model)
    flat.install()
    model(torch.randn(5, 8)).backward()
    gone = weakref.ref(model.body.weight)
    del model, flat
    gc.collect()
    assert gone() is None


def test_only_steps_of_several_backwards_use_the_buffer(tiny_model_dir: Path, monkeypatch) -> None:
    installs = []
    monkeypatch.setattr(FlatGrads, "install", lambda self: installs.append(1))
    for micro, expected in ((4, 0), (2, 2)):  # 8 rows, mini-batches of 4: 2 steps
        overrides = [f"model.path={tiny_model_dir}", "trainer.dtype=float32"]
        overrides += [f"trainer.micro_batch_size={micro}", "trainer.mini_batch_size=4"]
        overrides += ["trainer.shared_prefix=false"]
        trainer = trainers.build_trainer(load_config("smoke", overrides), tiny_model_dir, None)
        installs.clear()
        trainer.update(rows(), iteration=1)
        assert len(installs) == expected, micro
