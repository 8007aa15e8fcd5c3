"""The update's optimizer by trainer.optimizer_state: bf16 moments follow torch's AdamW to bf16
rounding, store 2 bytes per moment, come back as bf16 from a saved state; the setting needs
ZeRO stage 0; a torchao learning rate is set in place."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from agent_core.trainer import optimizers
from configs.trainer import TrainerSection


def _problem(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(300, 40, generator=gen)
    grads = [torch.randn(300, 40, generator=gen) for _ in range(12)]
    return weight, grads


def _run(make, weight, grads):
    param = torch.nn.Parameter(weight.clone())
    opt = make([param])
    for grad in grads:
        param.grad = grad.clone()
        opt.step()
    return param.detach(), opt


def test_bf16_moments_follow_torch_adamw(monkeypatch) -> None:
    monkeypatch.setattr(optimizers, "SLICE", 1000)  # 12 slices of the 12,000 elements
    weight, grads = _problem()
    kwargs = {"lr": 1e-2, "betas": (0.9, 0.999), "weight_decay": 0.1}
    want, _ = _run(lambda p: torch.optim.AdamW(p, **kwargs), weight, grads)
    got, opt = _run(lambda p: optimizers.BF16MomentsAdamW(p, **kwargs), weight, grads)
    state = next(iter(opt.state.values()))
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    assert float(state["step"]) == 12
    moved = (want - weight).abs()
    assert (got - want).abs().max() < 0.02 * moved.max()  # the moments' rounding, not a bug
    assert not torch.equal(got, want)


def test_a_saved_bf16_state_loads_back_as_bf16() -> None:
    weight, grads = _problem(1)
    kwargs = {"lr": 1e-2, "betas": (0.9, 0.95), "weight_decay": 0.0}
    first, opt = _run(lambda p: optimizers.BF16MomentsAdamW(p, **kwargs), weight, grads[:6])
    param = torch.nn.Parameter(first.clone())
    again = optimizers.BF16MomentsAdamW([param], **kwargs)
    again.load_state_dict(opt.state_dict())
    state = again.state[param]
    assert state["exp_avg"].dtype == torch.bfloat16
    assert torch.equal(state["exp_avg_sq"], next(iter(opt.state.values()))["exp_avg_sq"])
    straight, _ = _run(lambda p: optimizers.BF16MomentsAdamW(p, **kwargs), weight, grads)
    for grad in grads[6:]:
        param.grad = grad.clone()
        again.step()
    assert torch.equal(param.detach(), straight)


def test_the_setting_picks_the_optimizer() -> None:
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert type(optimizers.build_optimizer(params, TrainerSection())) is torch.optim.AdamW
    bf16 = TrainerSection(optimizer_state="bfloat16")
    assert isinstance(optimizers.build_optimizer(params, bf16), optimizers.BF16MomentsAdamW)


def test_compact_moments_need_zero_stage_0() -> None:
    with pytest.raises(ValidationError, match="optimizer_state='8bit' needs zero_stage=0"):
        TrainerSection(optimizer_state="8bit", zero_stage=1)


def test_a_tensor_learning_rate_is_set_in_place() -> None:
    group = {"lr": torch.tensor(1e-3)}
    held = group["lr"]
    optimizers.set_lr(group, 5e-4)
    assert group["lr"] is held and float(held) == pytest.approx(5e-4)
    plain = {"lr": 1e-3}
    optimizers.set_lr(plain, 5e-4)
    assert plain["lr"] == 5e-4
