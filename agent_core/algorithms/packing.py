"""Append-only packing: the steps of one trajectory as one sequence with per-step loss masks.

When every step's prompt extends the previous prompt + response token for token, one causal
forward over the last step's prompt + response yields every step's response log-probs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

StepTokens = tuple[Sequence[int], Sequence[int]]  # (prompt_ids, response_ids) of one step


@dataclass(frozen=True)
class PackedSequence:
    """One trajectory packed. Shapes: [L] = last step's prompt + response length.

    input_ids: the tokens; loss_mask: 1.0 on every step's response tokens; step_of_token: the
    step a response token belongs to (-1 on prompt/feedback tokens); response_slices[k]:
    (start, stop) positions of step k's response in input_ids.
    """

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    step_of_token: torch.Tensor
    response_slices: list[tuple[int, int]]

    @property
    def num_steps(self) -> int:
        return len(self.response_slices)


def is_append_only(steps: Sequence[StepTokens]) -> bool:
    """True when each step's prompt starts with the previous step's prompt + response."""
    for (prev_prompt, prev_response), (prompt, _) in itertools.pairwise(steps):
        prefix = list(prev_prompt) + list(prev_response)
        if list(prompt[: len(prefix)]) != prefix:
            return False
    return True


def pack_trajectory(steps: Sequence[StepTokens]) -> PackedSequence:
    """Pack an append-only trajectory's steps (see `is_append_only`) into one sequence."""
    if not steps:
        raise ValueError("pack_trajectory needs at least one step")
    if not is_append_only(steps):
        raise ValueError(
            "trajectory is not append-only (a step's prompt does not extend the previous "
            "prompt + response): train its steps unpacked"
        )
    last_prompt, last_response = steps[-1]
    input_ids = torch.tensor(list(last_prompt) + list(last_response), dtype=torch.long)
    loss_mask = torch.zeros(input_ids.shape, dtype=torch.float32)
    step_of_token = torch.full(input_ids.shape, -1, dtype=torch.long)
    slices = []
    for k, (prompt, response) in enumerate(steps):
        start, stop = len(prompt), len(prompt) + len(response)
        loss_mask[start:stop] = 1.0
        step_of_token[start:stop] = k
        slices.append((start, stop))
    return PackedSequence(input_ids, loss_mask, step_of_token, slices)


def scatter_to_packed(
    packed: PackedSequence, values: Sequence[float | Sequence[float]], fill: float = 0.0
) -> torch.Tensor:
    """Per-step values laid out like `packed.input_ids` [L] (float32, `fill` elsewhere).

    values[k] is either one number for step k (e.g. its advantage; broadcast over its response
    tokens) or one number per response token of step k (e.g. its old log-probs)."""
    if len(values) != packed.num_steps:
        raise ValueError(f"got values for {len(values)} steps, packed has {packed.num_steps}")
    out = torch.full(packed.input_ids.shape, fill, dtype=torch.float32)
    for k, ((start, stop), value) in enumerate(zip(packed.response_slices, values, strict=True)):
        step_values = torch.as_tensor(value, dtype=torch.float32)
        if step_values.dim() > 0 and step_values.numel() != stop - start:
            raise ValueError(
                f"step {k}: {step_values.numel()} values for {stop - start} response tokens"
            )
        out[start:stop] = step_values
    return out


def split_packed(packed: PackedSequence, token_values: torch.Tensor) -> list[torch.Tensor]:
    """Per-token values [L] (e.g. packed log-probs) cut back into each step's response."""
    return [token_values[start:stop] for start, stop in packed.response_slices]


def logit_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions whose next-token logits predict a response token: loss_mask [B, L] -> bool
    [B, L], True at p when loss_mask[p + 1] is 1. Pass it as HF `logits_to_keep` to project
    only those positions onto the vocabulary (logits come back flat, [K, V], row-major)."""
    keep = torch.zeros(loss_mask.shape, dtype=torch.bool, device=loss_mask.device)
    keep[..., :-1] = loss_mask[..., 1:] > 0
    return keep


def collate_packed(sequences: Sequence[PackedSequence], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad packed trajectories into a batch: input_ids, attention_mask, loss_mask,
    step_of_token, all [B, L_max] (padding: pad_id, 0, 0, -1)."""
    width = max(int(s.input_ids.numel()) for s in sequences)
    batch = {
        "input_ids": torch.full((len(sequences), width), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros((len(sequences), width), dtype=torch.long),
        "loss_mask": torch.zeros((len(sequences), width), dtype=torch.float32),
        "step_of_token": torch.full((len(sequences), width), -1, dtype=torch.long),
    }
    for i, s in enumerate(sequences):
        n = int(s.input_ids.numel())
        batch["input_ids"][i, :n] = s.input_ids
        batch["attention_mask"][i, :n] = 1
        batch["loss_mask"][i, :n] = s.loss_mask
        batch["step_of_token"][i, :n] = s.step_of_token
    return batch
