"""The memory a run's process needs at its peak, estimated at load from the model's size and the
settings (the owners bench/memory.py measures: the trainer's weights, gradients and AdamW
moments, autocast's bf16 weight copies, the reference model, the rollout engine's weights, its
prefix cache, a micro-batch's logits and activations), against this machine's memory. A run
that will not fit is refused with the estimate and the settings that would make it fit.

The engine's KV cache is left out (it grows with the prompts an env writes, known only while it
runs), and so are processes other than the flow's (rollout workers, trainer ranks).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from configs.lora import LoraSection
from configs.run_config import RunConfig

GIB = 2**30
# RSS of the run's process before any model: torch, transformers, DeepSpeed, MLflow, Prefect's
# client and the run's Python objects (bench/memory.py: 0.5-0.9 GiB after imports)
PROCESS_BYTES = GIB
# what autograd keeps per position and decoder layer of a Llama-family model, in units of the
# hidden (h) and intermediate (i) sizes, bytes: bf16 autocast (normed inputs cast for q/k/v,
# attention's q/k/v/out, the MLP's gate/up/act inputs), and fp32 (about twice that)
ACTIVATION_BYTES = {"bfloat16": (28, 8), "float32": (56, 16)}
# the logits and fp32 log-softmax chunks of `head_logprobs` (64 MiB each, a few alive at once)
LOGIT_CHUNKS_BYTES = 3 * 64 * 2**20
# AdamW's two moments per trained parameter by trainer.optimizer_state (8bit: a byte each and
# an fp32 scale per block of 256)
MOMENT_BYTES = {"float32": 8.0, "bfloat16": 4.0, "8bit": 2 * (1 + 4 / 256)}
# what no owner above counts, as a share of their sum: allocator slack, the backward's and the
# optimizer step's transients, the KV cache of a rollout (bench/memory.py measured peaks 5-14 %
# above the owners' sum before this share was added)
HEADROOM = 0.15


@dataclass(frozen=True)
class ModelSize:
    """What the estimate needs of a model: its parameters and its text model's shape."""

    params: int
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    kv_dim: int  # hidden * key-value heads / attention heads


# what `model.source: smollm2-gguf` converts (SmolLM2-135M-Instruct), before it is converted
SMOLLM2_135M = ModelSize(134_515_008, 576, 1536, 30, 49152, 192)


def folder_size(folder: Path) -> ModelSize | None:
    """A model folder's size: its parameters from the safetensors headers (no weights are
    read), its shape from config.json (a VLM's text model); None without both."""
    config_file = Path(folder) / "config.json"
    shards = sorted(Path(folder).glob("*.safetensors"))
    if not config_file.is_file() or not shards:
        return None
    try:  # a folder the estimate cannot read is left to the model loader's own errors
        config = json.loads(config_file.read_text())
        text = config.get("text_config", config)
        params = sum(shard_params(shard) for shard in shards)
        hidden, heads = text["hidden_size"], text["num_attention_heads"]
        kv_heads = text.get("num_key_value_heads", heads)
        return ModelSize(
            params,
            hidden,
            text.get("intermediate_size", 4 * hidden),
            text["num_hidden_layers"],
            text["vocab_size"],
            hidden * kv_heads // heads,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError):
        return None


def shard_params(shard: Path) -> int:
    """The parameters a safetensors file holds, from its header's shapes (at most the
    format's 100 MB header is read)."""
    with open(shard, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if length > 100_000_000:
            raise ValueError(f"{shard.name}: a header of {length} bytes")
        header = json.loads(f.read(length))
    params = 0
    for name, info in header.items():
        if name != "__metadata__":
            count = 1
            for dim in info["shape"]:
                count *= dim
            params += count
    return params


def tiny_size(hidden: int, layers: int) -> ModelSize:
    """The 'tiny-random' Llama (`agent_core.models.build_tiny_model`): intermediate 2h,
    half-size key-value heads, a 259-token byte vocabulary with tied embeddings."""
    vocab, kv = 259, hidden // 2
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * 2 * hidden + 2 * hidden
    return ModelSize(
        layers * per_layer + vocab * hidden + hidden, hidden, 2 * hidden, layers, vocab, kv
    )


def model_size(config: RunConfig) -> ModelSize | None:
    """The configured model's size: the folder's when it exists, else what its source will
    build; None when neither is known (a VLM not built yet)."""
    m = config.model
    if m.source == "tiny-random":
        return tiny_size(m.tiny_hidden_size, m.tiny_layers)
    size = folder_size(Path(m.path))
    if size is None and m.source == "smollm2-gguf":
        return SMOLLM2_135M
    return size


def _lora_params(size: ModelSize, config: RunConfig) -> int:
    """Adapter parameters: r x (in + out) per adapted linear of every layer."""
    h, i, kv = size.hidden, size.intermediate, size.kv_dim
    shapes = {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    lora = config.trainer.lora
    per_layer = sum(lora.r * sum(shapes[t]) for t in lora.target_modules if t in shapes)
    return per_layer * size.layers


def _micro_batch(config: RunConfig) -> tuple[int, int]:
    """Positions of a micro-batch's forward and response tokens whose logits it computes:
    a prefix tree of at most trainer.micro_batch_tokens positions, or micro_batch_size padded
    rows of a whole step (a packed trajectory ends with its last step's prompt and reply)."""
    t, r = config.trainer, config.rollout
    sequence = r.max_prompt_tokens + r.max_new_tokens
    positions = t.micro_batch_tokens if t.shared_prefix else t.micro_batch_size * sequence
    steps = config.env.max_steps if t.pack_trajectories else 1
    return positions, min(positions, t.micro_batch_size * steps * r.max_new_tokens)


def _engine_bytes(config: RunConfig, size: ModelSize) -> dict[str, int]:
    """The in-process rollout engine's weights: its packed copy, and its plain copy unless it
    shares the trainer's (fp32, a sequential in-process full fine-tune)."""
    r, t = config.rollout, config.trainer
    if r.engine != "hf" or r.workers > 0:
        return {}
    width = 4 if r.dtype == "float32" else 2
    shared = width == 4 and t.lora is None and t.ranks == 1 and config.overlap.max_staleness == 0
    packed = size.params * width if r.fused_forward and r.pack_weights else 0
    return {
        "engine weights": 0 if shared else size.params * width,
        "engine packed weights": packed,
    }


def _trainer_bytes(config: RunConfig, size: ModelSize) -> dict[str, int]:
    """The in-process trainer's fp32 weights, gradients and AdamW moments, autocast's bf16
    weight copies, and a frozen reference for a KL term. Autograd keeps the bf16 copy of
    every weight a micro-batch's forward multiplies, frozen ones too (its input's gradient
    needs it): of every layer's, or with gradient checkpointing of one layer's and the
    output embedding's."""
    t = config.trainer
    if t.ranks > 1:  # in Ray actors: other processes
        return {}
    trained = _lora_params(size, config) if t.lora is not None else size.params
    kl = t.kl_loss_coef > 0 or config.algorithm.kl_coef > 0
    cast = size.params
    if t.gradient_checkpointing:
        cast = size.params // size.layers + size.vocab * size.hidden
    return {
        "trainer weights": (size.params + (trained if t.lora is not None else 0)) * 4,
        "trainer gradients": trained * 4,
        "trainer AdamW moments": int(trained * MOMENT_BYTES[t.optimizer_state]),
        "bf16 weight copies (autocast)": cast * 2 if t.dtype != "float32" else 0,
        "reference model": size.params * 4 if kl and t.lora is None else 0,
    }


def _batch_bytes(config: RunConfig, size: ModelSize) -> dict[str, int]:
    """A micro-batch's logits and the activations its backward keeps (with gradient
    checkpointing: each layer's input, and one layer's activations again). The LM head runs a
    chunk of tokens at a time; a trained head's weight gradient needs the [tokens, vocab]
    gradient of its logits (a LoRA run's head is frozen), and under ZeRO-3 the logits are
    whole."""
    t = config.trainer
    dtype = "float32" if t.dtype == "float32" else "bfloat16"
    positions, tokens = _micro_batch(config)
    per_h, per_i = ACTIVATION_BYTES[dtype]
    layer = positions * (per_h * size.hidden + per_i * size.intermediate)
    if t.gradient_checkpointing:
        activations = positions * size.layers * size.hidden * 4 + layer
    else:
        activations = layer * size.layers
    whole = t.lora is None or t.zero_stage == 3
    logits = LOGIT_CHUNKS_BYTES
    if whole:
        logits += tokens * size.vocab * (2 if dtype == "bfloat16" else 4)
    return {"logits of a micro-batch": logits, "activations of a micro-batch": activations}


def phase_estimates(config: RunConfig, size: ModelSize) -> dict[str, dict[str, int]]:
    """The bytes by owner at the peak of the 'update', of 'collect' and (LoRA) of the update's
    'checkpoint'. A rollout holds the trainer's weights and moments (its gradients are freed
    after each step), the engine and its prefix cache; the update adds gradients, autocast's
    copies and a micro-batch's logits and activations, and a sequential run's engine frees
    its packed weights for it (`live.free_engine_caches`)."""
    trainer, engine = _trainer_bytes(config, size), _engine_bytes(config, size)
    during_update = dict(engine)
    if engine and config.overlap.max_staleness == 0:
        during_update["engine packed weights"] = 0
    update = {"process": PROCESS_BYTES, **trainer, **during_update, **_batch_bytes(config, size)}
    transient = ("trainer gradients", "bf16 weight copies (autocast)")
    collect = {"process": PROCESS_BYTES, **engine}
    collect |= {k: v for k, v in trainer.items() if k not in transient}
    if engine:
        collect["engine prefix cache"] = config.rollout.prefix_cache_mib * 2**20
    phases = {"update": update, "collect": collect}
    if trainer and config.trainer.lora is not None:
        # a LoRA checkpoint writes the base merged with the adapters: a new fp32 copy of the
        # adapted weights beside the trainer's, at the end of the update and of the warm-up
        saved = {k: v for k, v in trainer.items() if k not in transient}
        merged = {"merged weights (LoRA checkpoint)": size.params * 4}
        phases["checkpoint"] = {"process": PROCESS_BYTES, **saved, **during_update, **merged}
    for owners in phases.values():
        owners["slack and transients"] = int(HEADROOM * sum(owners.values()))
    return phases


def peak_estimate(config: RunConfig, size: ModelSize) -> tuple[str, dict[str, int]]:
    """The phase with the highest peak (of `phase_estimates`) and its bytes by owner."""
    phases = phase_estimates(config, size).items()
    return max(phases, key=lambda phase: sum(phase[1].values()))


def _with(config: RunConfig, section: str, **values) -> RunConfig:
    changed = getattr(config, section).model_copy(update=values)
    return config.model_copy(update={section: changed})


def _fixes(config: RunConfig) -> list[tuple[str, RunConfig]]:
    """Settings that cut the peak, each with the config it gives on top of the ones before."""
    t, r = config.trainer, config.rollout
    steps: list[tuple[str, RunConfig]] = []
    if not t.gradient_checkpointing:
        config = _with(config, "trainer", gradient_checkpointing=True)
        steps.append(("trainer.gradient_checkpointing=true", config))
    if t.shared_prefix and t.micro_batch_tokens >= 512:
        config = _with(config, "trainer", micro_batch_tokens=t.micro_batch_tokens // 2)
        steps.append((f"trainer.micro_batch_tokens={t.micro_batch_tokens // 2}", config))
    elif not t.shared_prefix and t.micro_batch_size > 1 and t.micro_batch_size % 2 == 0:
        config = _with(config, "trainer", micro_batch_size=t.micro_batch_size // 2)
        steps.append((f"trainer.micro_batch_size={t.micro_batch_size // 2}", config))
    if t.lora is None:
        config = _with(config, "trainer", lora=LoraSection())
        steps.append(("trainer.lora={r: 16}", config))
    if r.dtype == "float32":
        config = _with(config, "rollout", dtype="bfloat16")
        steps.append(("rollout.dtype=bfloat16 (with trainer.old_logprobs=recompute)", config))
    if r.pack_weights:
        config = _with(config, "rollout", pack_weights=False)
        steps.append(("rollout.pack_weights=false", config))
    return steps


def memory_problems(config: RunConfig, memory: int) -> list[tuple[str, str]]:
    """(field, message) when the estimated peak is past `memory` bytes: the estimate by owner
    and the settings that would make it fit (those before a fitting one included)."""
    size = model_size(config)
    if size is None:
        return []
    phase, owners = peak_estimate(config, size)
    need = sum(owners.values())
    if need <= memory:
        return []
    field = "model.tiny_hidden_size" if config.model.source == "tiny-random" else "model.path"
    listed = ", ".join(f"{name} {b / GIB:,.1f}" for name, b in owners.items() if b)
    applied: list[str] = []
    advice = ""
    for label, changed in _fixes(config):
        applied.append(label)
        estimate = sum(peak_estimate(changed, size)[1].values())
        if estimate <= memory:
            advice = f"set {', '.join(applied)} (about {estimate / GIB:,.1f} GiB)"
            break
    else:
        advice = (
            f"even with {', '.join(applied)} it needs about {estimate / GIB:,.1f} GiB: "
            "train a smaller model"
            if applied
            else "train a smaller model"
        )
    return [
        (
            field,
            f"a {size.params / 1e6:,.1f}M-parameter model needs about {need / GIB:,.1f} GiB at "
            f"its {phase} ({listed} GiB), more than this machine's {memory / GIB:,.1f} GiB: "
            f"{advice}",
        )
    ]
