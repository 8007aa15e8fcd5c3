"""The update's AdamW by how it stores its moments (trainer.optimizer_state): torch's fused AdamW
(fp32), `BF16MomentsAdamW` (bf16 moments beside fp32 weights, which torch's kernels refuse) or
torchao's AdamW8bit (block-wise 8-bit moments); and setting a param group's learning rate on
any of them."""

from __future__ import annotations

import math

import torch

from configs.trainer import TrainerSection

# elements of a parameter per slice of the bf16 step: its fp32 temporaries stay at 64 MiB
SLICE = 1 << 22
TORCHAO_FIX = (
    "trainer.optimizer_state='8bit' needs the torchao package: pip install -e '.[optim8bit]' "
    "(torchao==0.18.0), or set trainer.optimizer_state=float32"
)


class BF16MomentsAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, bias-corrected moments) whose two moments are stored in
    bfloat16: each step reads them into fp32, a slice of the parameter at a time, updates the
    weight from the fp32 values and rounds them back (round to nearest)."""

    def __init__(self, params, lr: float, betas, weight_decay: float, eps: float = 1e-8) -> None:
        defaults = {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay, "eps": eps}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)
        return loss

    def _update(self, param: torch.Tensor, group: dict) -> None:
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.bfloat16)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.bfloat16)
        state["step"] += 1
        step = float(state["step"])
        (beta1, beta2), lr = group["betas"], float(group["lr"])
        bias1, bias2 = 1 - beta1**step, math.sqrt(1 - beta2**step)
        flat = [
            t.view(-1)
            for t in (param, param.grad.contiguous(), state["exp_avg"], state["exp_avg_sq"])
        ]
        for start in range(0, param.numel(), SLICE):
            weight, grad, m16, v16 = (t[start : start + SLICE] for t in flat)
            grad = grad.float()
            m = m16.float().lerp_(grad, 1 - beta1)
            v = v16.float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            m16.copy_(m)
            v16.copy_(v)
            weight.mul_(1 - lr * group["weight_decay"])
            weight.addcdiv_(m, v.sqrt_().div_(bias2).add_(group["eps"]), value=-lr / bias1)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch casts a loaded state to its parameter's dtype (fp32): the moments go back to
        bf16 (they were saved in it, so nothing is lost)."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(torch.bfloat16)


def build_optimizer(params, cfg: TrainerSection) -> torch.optim.Optimizer:
    """The AdamW of trainer.optimizer_state over `params` (tensors or param groups). torch's
    fused kernel makes one pass over weights, grads and moments (the per-parameter loop makes
    ~6): a 135M-parameter step took 1.5 s instead of 15 s on a 2-core CPU (bench/update.py),
    and a client optimizer avoids compiling DeepSpeed's Adam ops on CPU."""
    kwargs = {"lr": cfg.learning_rate, "betas": tuple(cfg.betas), "weight_decay": cfg.weight_decay}
    if cfg.optimizer_state == "bfloat16":
        return BF16MomentsAdamW(params, **kwargs)
    if cfg.optimizer_state == "8bit":
        return _adamw_8bit()(params, **kwargs)
    return torch.optim.AdamW(params, fused=True, **kwargs)


def _adamw_8bit() -> type[torch.optim.Optimizer]:
    """torchao's AdamW8bit whose state dict holds each 8-bit moment as its plain tensors (codes,
    block scales, code table): DeepSpeed loads a checkpoint with a callable map_location, which
    torch refuses for tensor subclasses."""
    try:
        from torchao.optim import AdamW8bit
        from torchao.optim.subclass_8bit import OptimState8bit
    except ImportError as err:
        raise RuntimeError(TORCHAO_FIX) from err

    def plain(value):
        if not isinstance(value, OptimState8bit):
            return value
        names, attributes = value.__tensor_flatten__()
        return {"8bit": {name: getattr(value, name) for name in names}, "attrs": attributes}

    class PlainStateAdamW8bit(AdamW8bit):
        def state_dict(self) -> dict:
            saved = super().state_dict()  # its per-parameter dicts are the live ones: copy
            saved["state"] = {
                index: {key: plain(value) for key, value in state.items()}
                for index, state in saved["state"].items()
            }
            return saved

        def load_state_dict(self, state_dict: dict) -> None:
            """torch casts every loaded tensor to its parameter's dtype: the codes go back to
            uint8 (integers up to 255: exact in fp32)."""
            super().load_state_dict(state_dict)
            for state in self.state.values():
                for key, value in state.items():
                    if isinstance(value, dict) and "8bit" in value:
                        tensors = {**value["8bit"], "codes": value["8bit"]["codes"].byte()}
                        state[key] = OptimState8bit.__tensor_unflatten__(tensors, value["attrs"])

    return PlainStateAdamW8bit


def set_lr(group: dict, lr: float) -> None:
    """Set a param group's learning rate: in place where the optimizer holds it as a tensor
    (torchao's, whose compiled step would otherwise recompile or refuse a float)."""
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(lr)
    else:
        group["lr"] = lr
