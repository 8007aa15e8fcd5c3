"""`FlatGrads`: an optimizer step's gradients in one buffer per dtype, allocated before the
step's first backward (`TrainEngine.begin_step`, for a step of several backwards) and released
at the step. Autograd otherwise allocates each weight's gradient on its own in the middle of
the backward, most of them (a 135M model's 0.4-3.5 MB matrices) below glibc's mmap threshold,
so they land in the malloc arenas between the activations' blocks, and what the arenas keep
after the step stays resident; one large buffer is mapped and unmapped whole. The gradients'
values are those autograd gives: it adds each micro-batch's gradient in place into a weight's
existing gradient, and the first add lands on zeros. A weight no backward of the step reached
gets its gradient back to None before the step (as without the buffer: AdamW skips it,
clipping leaves it out).
"""

from __future__ import annotations

import functools

import torch
from torch import nn


class FlatGrads:
    """Owns the flat gradient buffers of `module`'s weights for one optimizer step at a time."""

    def __init__(self, module: nn.Module) -> None:
        self.params = list(module.parameters())
        self.reached: set[int] = set()
        self.hooked: set[int] = set()
        self.buffers: list[torch.Tensor] = []

    @staticmethod
    def _reach(reached: set[int], param: torch.Tensor) -> None:
        reached.add(id(param))

    def install(self) -> None:
        """Before a backward: when no trainable weight holds a gradient (the step's first
        backward), give every trainable weight a zeroed view of one buffer per dtype and
        device as its gradient."""
        trainable = [p for p in self.params if p.requires_grad]
        if self.buffers or any(p.grad is not None for p in trainable):
            return
        groups: dict[tuple, list[torch.Tensor]] = {}
        for param in trainable:
            groups.setdefault((param.dtype, param.device), []).append(param)
        for param in trainable:  # a weight frozen so far (e.g. before an alignment stage) too
            if id(param) not in self.hooked:
                # the hook holds the id set alone: one that held this object (and so the
                # weights) would make a cycle through the weights' C++ side that Python's
                # collector cannot free, keeping a dropped trainer's weights alive
                param.register_post_accumulate_grad_hook(
                    functools.partial(self._reach, self.reached)
                )
                self.hooked.add(id(param))
        for (dtype, device), params in groups.items():
            buffer = torch.zeros(sum(p.numel() for p in params), dtype=dtype, device=device)
            start = 0
            for param in params:
                param.grad = buffer[start : start + param.numel()].view_as(param)
                start += param.numel()
            self.buffers.append(buffer)

    def settle(self) -> None:
        """Before the step: a weight that no backward reached loses its (zero) gradient."""
        if not self.buffers:
            return
        for param in self.params:
            if param.grad is not None and id(param) not in self.reached:
                param.grad = None

    def release(self) -> None:
        """After the step (or a dropped one) cleared the gradients: the buffers go; the memory
        returns to the OS once no gradient views it."""
        self.buffers.clear()
        self.reached.clear()
