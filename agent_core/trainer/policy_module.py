"""`PolicyModule`: the causal LM (or image-text-to-text model) plus an optional value head,
computing logits only where a response token is predicted and values only at each step's last
prompt token; loading a policy folder as the model it is, and which of a VLM's weights train."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from agent_core.models import is_vision_folder
from agent_core.prompting.vision import check_positions

VALUE_HEAD_FILE = "value_head.safetensors"
# a VLM's vision encoder, by the name its model class gives it (LLaVA, Idefics3/SmolVLM,
# Qwen2-VL); the projector into the language model is not part of it and always trains
VISION_TOWERS = ("vision_tower", "vision_model", "visual")
PROJECTORS = ("multi_modal_projector", "connector", "merger")


def pretrained_lm(path: str | Path) -> nn.Module:
    """The policy folder's model in fp32: `AutoModelForImageTextToText` for a folder with a
    vision tower, else `AutoModelForCausalLM`."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if is_vision_folder(path) else AutoModelForCausalLM
    return auto.from_pretrained(path, dtype=torch.float32, trust_remote_code=False)


def freeze_vision_tower(lm: nn.Module) -> int:
    """Stop the vision encoder's weights from training (its projector trains on); returns how
    many tensors were frozen (0 for a text model)."""
    frozen = 0
    for name, param in lm.named_parameters():
        parts = name.split(".")
        if any(t in parts for t in VISION_TOWERS) and not any(p in parts for p in PROJECTORS):
            param.requires_grad_(False)
            frozen += 1
    return frozen


class PolicyModule(nn.Module):
    """Wraps a HF causal LM (`lm`) and, for PPO/GAE, a linear value head on its last hidden
    state (the trunk is shared, so the value loss also shapes the representation)."""

    def __init__(self, lm: nn.Module, value_head: bool) -> None:
        super().__init__()
        self.lm = lm
        # an image-text-to-text model: its trunk merges the images' features into the prompt
        self.sees = hasattr(lm.config, "vision_config")
        if self.sees:
            check_positions(lm.get_base_model() if hasattr(lm, "get_base_model") else lm)
        hidden = lm.config.get_text_config().hidden_size
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
        vision: dict[str, torch.Tensor] | None = None,
        head: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [N, V] at `token_pos` [N, 2] and values [S] at `value_pos` [S, 2] (or None);
        `vision`: a VLM's image inputs for the batch's sequences (pixel values, ...); `head`
        False: the last hidden states [N, H] at `token_pos` in place of the logits, for a
        caller that applies the LM head a chunk of tokens at a time (`head_logprobs`)."""
        trunk = self._trunk() if self.sees else self.lm.get_decoder()
        hidden = trunk(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **(vision or {}),
        ).last_hidden_state
        picked = hidden[token_pos[:, 0], token_pos[:, 1]]
        logits = self.lm.get_output_embeddings()(picked) if head else picked
        values = None
        if self.value_head is not None and value_pos is not None:
            at = hidden[value_pos[:, 0], value_pos[:, 1]]
            values = self.value_head(at).squeeze(-1).float()
        return logits, values

    def _trunk(self) -> nn.Module:
        """A VLM's model without its LM head: vision encoder, projector, language model."""
        base = self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm
        return base.model

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
