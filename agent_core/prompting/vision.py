"""The image side of a prompt for the model's forward: the processor's image inputs (pixel values
and what goes with them: grid sizes, pixel masks) for the images of a batch of prompts, merged
into one batch the way the model's forward takes them. The rollout engine and the update's
batching both build them here, from the same images, so both forwards see the same pixels.
"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

# models whose processor gives pixel values per prompt, [prompts, images, C, H, W] (a prompt
# with fewer images is padded with all-zero images, which these models skip); every other
# model takes its images one after another along the first dimension, prompt by prompt
PER_PROMPT = ("idefics2", "idefics3", "smolvlm")
# models whose every picture is the same number of image tokens (a fixed-resolution processor):
# the update's prefix trees tell their pictures apart (`trainer.batching.tree_keys`)
FIXED_TOKENS = ("llava",)


def check_positions(model: Any) -> None:
    """Refuse a model whose image tokens take multimodal rotary positions (Qwen2-VL and
    Qwen2.5-VL: `get_rope_index`): steprl's engine and update give every token one position
    in its sequence, which would feed such a model the wrong positions."""
    trunk = getattr(model, "model", None)
    if hasattr(trunk, "get_rope_index"):
        raise ValueError(
            f"{type(model).__name__} places image tokens with multimodal rotary positions "
            "(get_rope_index), which steprl's engine and update do not compute: use a "
            "LLaVA-style or SmolVLM/Idefics3 folder (python -m agent_core.models prepare-vlm "
            "builds one)"
        )


def vision_inputs(
    processor: Any, model_type: str, images: list[list[Image.Image]]
) -> dict[str, torch.Tensor]:
    """The image inputs of a batch whose prompt i shows `images[i]` (in prompt order): the
    processor's image outputs for each prompt, merged along the batch; {} when no prompt
    shows an image."""
    parts = [
        dict(processor.image_processor(images=shown, return_tensors="pt")) if shown else {}
        for shown in images
    ]
    if not any(parts):
        return {}
    if model_type in PER_PROMPT:
        return _per_prompt(parts)
    keys = next(p for p in parts if p).keys()
    return {key: torch.cat([p[key] for p in parts if p]) for key in keys}


def _per_prompt(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """[prompts, images, ...] tensors: each prompt's own, padded with zeros to the most images."""
    shown = [p for p in parts if p]
    most = max(p["pixel_values"].shape[1] for p in shown)
    out: dict[str, torch.Tensor] = {}
    for key in shown[0]:
        template = shown[0][key][0, :1]  # one image's worth: its shape and dtype
        rows = []
        for p in parts:
            value = p[key][0] if p else template.new_zeros((0, *template.shape[1:]))
            pad = value.new_zeros((most - value.shape[0], *value.shape[1:]))
            rows.append(torch.cat([value, pad]))
        out[key] = torch.stack(rows)
    return out
