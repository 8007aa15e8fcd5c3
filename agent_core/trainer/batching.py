"""Step rows -> padded training tensors. Rows are left-padded so every response ends at the
right edge, and only the last `max_response + 1` positions need logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class TrainRow:
    """One step row as the update needs it."""

    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantage: float


@dataclass
class MicroBatch:
    """Tensors of one micro-batch. B rows, L = longest prompt+response, R = longest response.

    input_ids, attention_mask, position_ids: [B, L]; response_mask, old_logprobs: [B, R]
    (right-aligned: a row's response occupies its last len(response) columns); advantages: [B].
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor

    @property
    def response_tokens(self) -> int:
        return int(self.response_mask.sum().item())

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(**{k: v.to(device) for k, v in vars(self).items()})


def collate(rows: list[TrainRow], pad_id: int) -> MicroBatch:
    """Left-pad `rows` into one `MicroBatch`."""
    width = max(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    resp = max(len(r.response_ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    rmask = torch.zeros((len(rows), resp), dtype=torch.float32)
    old = torch.zeros((len(rows), resp), dtype=torch.float32)
    for i, row in enumerate(rows):
        seq = row.prompt_ids + row.response_ids
        ids[i, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        attn[i, width - len(seq) :] = 1
        n = len(row.response_ids)
        if n:
            rmask[i, resp - n :] = 1.0
            old[i, resp - n :] = torch.tensor(row.old_logprobs, dtype=torch.float32)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    adv = torch.tensor([r.advantage for r in rows], dtype=torch.float32)
    return MicroBatch(ids, attn, positions, rmask, old, adv)


def plan_minibatches(
    lengths: list[int], mini_batch_size: int, micro_batch_size: int, seed: int
) -> list[list[list[int]]]:
    """Shuffle row indices into mini-batches, then split each into micro-batches of rows of
    similar length (less padding). Returns [mini][micro] -> row indices."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    plan = []
    for start in range(0, len(order), mini_batch_size):
        mini = sorted(order[start : start + mini_batch_size].tolist(), key=lambda i: lengths[i])
        plan.append([mini[j : j + micro_batch_size] for j in range(0, len(mini), micro_batch_size)])
    return plan
