"""At load, a run's peak memory is estimated from its model's size and its settings, and a run
that will not fit is refused with the estimate and the settings that would make it fit: a
1.7B-parameter full fine-tune on a 24 GiB machine is told to train LoRA adapters, a 360M one
fits; what each setting cuts shows in the estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_core.config import memory_fit
from agent_core.config.load import load_config
from agent_core.config.presets import ConfigError

GIB = 2**30
# SmolLM2's published shapes (hidden, intermediate, layers, heads, key-value heads)
SHAPES = {"360M": (960, 2560, 32, 15, 5), "1.7B": (2048, 8192, 24, 32, 32)}


def shaped_folder(root: Path, shape: str) -> Path:
    """A model folder whose config.json and safetensors header have a SmolLM2 shape (the
    estimate reads no weights: the header holds shapes only)."""
    hidden, inter, layers, heads, kv_heads = SHAPES[shape]
    kv = hidden * kv_heads // heads
    folder = root / shape
    folder.mkdir()
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": 49152,
    }
    (folder / "config.json").write_text(json.dumps(config))
    shapes = {"model.embed_tokens.weight": [49152, hidden], "model.norm.weight": [hidden]}
    for i in range(layers):
        for name, dims in {
            "self_attn.q_proj": [hidden, hidden],
            "self_attn.k_proj": [kv, hidden],
            "self_attn.v_proj": [kv, hidden],
            "self_attn.o_proj": [hidden, hidden],
            "mlp.gate_proj": [inter, hidden],
            "mlp.up_proj": [inter, hidden],
            "mlp.down_proj": [hidden, inter],
            "input_layernorm": [hidden],
            "post_attention_layernorm": [hidden],
        }.items():
            shapes[f"model.layers.{i}.{name}.weight"] = dims
    header = json.dumps({k: {"dtype": "BF16", "shape": v} for k, v in shapes.items()}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    return folder


def _general(folder: Path, *extra: str):
    return load_config("learn_general", [f"model.path={folder}", "model.source=folder", *extra])


def _unchecked(folder: Path):
    """The general preset on `folder`, past load's own refusal (which the estimate is)."""
    config = load_config("learn_general")
    model = config.model.model_copy(update={"path": str(folder), "source": "folder"})
    return config.model_copy(update={"model": model})


def test_the_parameters_come_from_the_folders_headers(tmp_path: Path) -> None:
    size = memory_fit.folder_size(shaped_folder(tmp_path, "1.7B"))
    assert 1.70e9 < size.params < 1.72e9 and size.kv_dim == 2048 and size.layers == 24


def test_a_full_fine_tune_of_a_1_7b_model_is_told_to_train_lora(tmp_path: Path) -> None:
    folder = shaped_folder(tmp_path, "1.7B")
    config = _unchecked(folder)
    [(field, message)] = memory_fit.memory_problems(config, 24 * GIB)
    assert field == "model.path"
    assert "1,711.4M-parameter model needs about" in message and "at its update" in message
    assert "trainer AdamW moments 12.8" in message
    assert "trainer.lora={r: 16}" in message and "more than this machine's 24.0 GiB" in message
    assert memory_fit.memory_problems(config, 64 * GIB) == []


def test_refused_at_load_naming_the_field_and_the_fix(tmp_path: Path, monkeypatch) -> None:
    folder = shaped_folder(tmp_path, "1.7B")
    monkeypatch.setattr("agent_core.config.load._machine_memory", lambda: 24 * GIB)
    monkeypatch.setattr("agent_core.config.load._check_model_folder", lambda config: None)
    with pytest.raises(ConfigError, match=r"model\.path: a 1,711\.4M-parameter model .*lora"):
        _general(folder)


def test_a_360m_full_fine_tune_fits_24_gib(tmp_path: Path) -> None:
    folder = shaped_folder(tmp_path, "360M")
    config = _unchecked(folder)
    phase, owners = memory_fit.peak_estimate(config, memory_fit.folder_size(folder))
    assert phase == "update" and sum(owners.values()) < 12 * GIB
    assert memory_fit.memory_problems(config, 24 * GIB) == []


def test_what_each_setting_cuts_shows_in_the_estimate() -> None:
    base = load_config("learn_general")
    size = memory_fit.SMOLLM2_135M

    def owners(config) -> dict[str, int]:
        return memory_fit.phase_estimates(config, size)["update"]

    full = owners(base)
    assert full["trainer AdamW moments"] == 8 * size.params and full["engine weights"] == 0
    # the trainer's plain copy is shared; the packed one is freed for the update
    assert full["engine packed weights"] == 0
    checkpointed = owners(memory_fit._with(base, "trainer", gradient_checkpointing=True))
    assert checkpointed["activations of a micro-batch"] < full["activations of a micro-batch"] / 4
    lora = owners(memory_fit._with(base, "trainer", lora=memory_fit.LoraSection()))
    assert lora["trainer AdamW moments"] < full["trainer AdamW moments"] / 10
    assert lora["engine weights"] == 4 * size.params  # merged weights: the engine's own
    overlap = memory_fit._with(base, "overlap", max_staleness=1)
    assert owners(overlap)["engine weights"] == 4 * size.params
    assert owners(overlap)["engine packed weights"] == 4 * size.params  # sampling beside it


def test_autocast_keeps_a_bf16_copy_of_every_weight_lora_or_not() -> None:
    """A frozen weight's bf16 copy is kept for its input's gradient: a 1.7B-shaped LoRA update
    in the general preset was killed for memory past 18 GiB when only the adapters' were
    counted. With gradient checkpointing one layer's copies (and the output embedding's) are
    kept at a time."""
    lora = memory_fit._with(load_config("learn_general"), "trainer", lora=memory_fit.LoraSection())
    size = memory_fit.SMOLLM2_135M

    def casts(config) -> int:
        return memory_fit.phase_estimates(config, size)["update"]["bf16 weight copies (autocast)"]

    assert casts(lora) == 2 * size.params
    assert casts(memory_fit._with(lora, "trainer", gradient_checkpointing=True)) < size.params / 2


def test_a_lora_checkpoint_holds_a_merged_copy_of_the_weights() -> None:
    """Writing a LoRA checkpoint merges the adapters into a new fp32 copy of the weights beside
    the trainer's: the 1.7B-shaped warm-up peaked at 14.6 GiB, its trainer holding 6.4."""
    size = memory_fit.SMOLLM2_135M
    lora = memory_fit._with(load_config("learn_general"), "trainer", lora=memory_fit.LoraSection())
    saved = memory_fit.phase_estimates(lora, size)["checkpoint"]
    assert saved["merged weights (LoRA checkpoint)"] == 4 * size.params
    assert "checkpoint" not in memory_fit.phase_estimates(load_config("learn_general"), size)


def test_compact_moments_a_frozen_head_and_the_headroom_show_in_the_estimate() -> None:
    """Moments by trainer.optimizer_state; a LoRA run's frozen head needs no [tokens, vocab]
    buffer (the head runs a chunk of tokens at a time); each phase adds 15 % of its owners'
    sum for what they leave out (measured peaks ran 5-14 % above that sum)."""
    base = load_config("learn_general")
    size = memory_fit.SMOLLM2_135M

    def owners(config) -> dict[str, int]:
        return memory_fit.phase_estimates(config, size)["update"]

    full = owners(base)
    bf16 = owners(memory_fit._with(base, "trainer", optimizer_state="bfloat16"))
    assert bf16["trainer AdamW moments"] == 4 * size.params
    eight = owners(memory_fit._with(base, "trainer", optimizer_state="8bit"))
    assert eight["trainer AdamW moments"] < 2.1 * size.params
    lora = owners(memory_fit._with(base, "trainer", lora=memory_fit.LoraSection()))
    assert lora["logits of a micro-batch"] == memory_fit.LOGIT_CHUNKS_BYTES
    assert full["logits of a micro-batch"] > memory_fit.LOGIT_CHUNKS_BYTES
    for phase in memory_fit.phase_estimates(base, size).values():
        rest = sum(v for k, v in phase.items() if k != "slack and transients")
        assert phase["slack and transients"] == int(0.15 * rest)
