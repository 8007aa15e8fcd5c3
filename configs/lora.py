"""The `trainer.lora` sub-section: LoRA adapters (peft) trained instead of every weight, their
rank, scale, dropout and the linear layers that get them."""

from __future__ import annotations

from pydantic import Field

from configs.base import Section

LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraSection(Section):
    """LoRA adapters (peft): the update trains only these low-rank matrices; rollouts sample
    with the merged weights; the base model without adapters is the KL reference."""

    r: int = Field(16, ge=1, description="Rank of each adapter (B @ A with A: r x in).")
    alpha: float = Field(32.0, gt=0.0, description="LoRA alpha: the update is scaled by alpha / r.")
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input while training."
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(LLAMA_LINEARS),
        min_length=1,
        description="Names of the linear layers that get adapters (Llama/Qwen names by default).",
    )
