"""`PolicyModule`: the causal LM plus an optional value head, computing logits only where a
response token is predicted and values only at each step's last prompt token."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

VALUE_HEAD_FILE = "value_head.safetensors"


class PolicyModule(nn.Module):
    """Wraps a HF causal LM (`lm`) and, for PPO/GAE, a linear value head on its last hidden
    state (the trunk is shared, so the value loss also shapes the representation)."""

    def __init__(self, lm: nn.Module, value_head: bool) -> None:
        super().__init__()
        self.lm = lm
        hidden = lm.config.hidden_size
        self.value_head = nn.Linear(hidden, 1) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        token_pos: torch.Tensor,
        value_pos: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [N, V] at `token_pos` [N, 2] and values [S] at `value_pos` [S, 2] (or None)."""
        hidden = self.lm.get_decoder()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).last_hidden_state
        picked = hidden[token_pos[:, 0], token_pos[:, 1]]
        logits = self.lm.get_output_embeddings()(picked)
        values = None
        if self.value_head is not None and value_pos is not None:
            at = hidden[value_pos[:, 0], value_pos[:, 1]]
            values = self.value_head(at).squeeze(-1).float()
        return logits, values

    def save_value_head(self, folder: Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """Write the value head next to the HF files (HF loaders ignore it)."""
        if self.value_head is None:
            return
        tensors = state if state is not None else self.value_head.state_dict()
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in tensors.items()}, folder / VALUE_HEAD_FILE
        )

    def load_value_head(self, folder: Path) -> bool:
        """Restore the value head saved with a checkpoint; False when there is none."""
        path = Path(folder) / VALUE_HEAD_FILE
        if self.value_head is None or not path.is_file():
            return False
        self.value_head.load_state_dict(load_file(path))
        return True
