"""Where a training run's memory goes: peak and steady resident memory (RSS) of each phase
(evaluate, warm-up, collect, score, write_replay, update, log) and the bytes each owner holds
(trainer weights, gradients and AdamW moments, the reference model, the rollout engine's
weights and packed copies, its KV and prefix caches, logits and activations kept for the
backward, other tensors), per parameter, beside a plain torch AdamW step on the same model (a
full fine-tune's; not run for LoRA), and the load-time estimate of the peak beside the measured
one.

A real short run in this one process through the `agent_core` phase functions in the flow's
order (no Prefect: its API server would add its own memory); the rollout engine and trainer stay
cached across phases as in a real run. Before each phase the kernel's peak-RSS mark is reset
(`/proc/self/clear_refs` = 5); after it `VmHWM` is that phase's exact peak and `VmRSS` its
steady RSS. Bytes per parameter are (RSS - RSS after imports) / the model's parameters.
Owners are counted from the live tensors (each storage once); what the backward keeps is
counted through autograd's saved-tensor hooks, the KV cache at its allocation.

Presets: `demo` (configs/calculator_grpo.yaml), `general` (configs/learn_general.yaml with
a short warm-up and evaluation); models: the converted SmolLM2-135M-Instruct, or random-init
models of the shapes of SmolLM2-135M, 360M and 1.7B (`--shape`, built here from their
published configs, with SmolLM2's tokenizer; no weights are downloaded).
Run: .venv/bin/python bench/memory.py [--preset general] [--shape 360M] [--set KEY=VALUE ...]
--optimizer-states: only two full fine-tune steps per trainer.optimizer_state (peak, moments).
--smoke: the smoke preset (tiny random model) with a warm-up, one iteration of 2 tasks, and the
optimizer states' steps.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from offline import DEFAULT_MODEL, SMOKE_HELP, add_record_option, figure, prepare, write_record

REPO = Path(__file__).resolve().parent.parent
MB = 2**20
GB = 2**30

# The published configs of the SmolLM2 family (Hugging Face, HuggingFaceTB/SmolLM2-*): Llama
# decoders with tied embeddings and a 49152-token vocabulary.
SMOLLM2_SHAPES: dict[str, dict] = {
    "135M": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "rope_theta": 100000.0,
    },
    "360M": {
        "hidden_size": 960,
        "intermediate_size": 2560,
        "num_hidden_layers": 32,
        "num_attention_heads": 15,
        "num_key_value_heads": 5,
        "rope_theta": 100000.0,
    },
    "1.7B": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "rope_theta": 130000.0,
    },
}
SMOLLM2_COMMON = {
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}
# short runs of each preset: few tasks, a short warm-up and evaluation (the sizes that set
# the memory, micro-batches and the model, stay the preset's)
PRESET_SETTINGS = {
    "demo": ("calculator_grpo", []),
    "general": (
        "learn_general",
        [
            "warmup.tasks=16",
            "warmup.epochs=1",
            "warmup.heldout_episodes=4",
            "eval.episodes=8",
            "eval.every=1",
        ],
    ),
    "smoke": (
        "smoke",
        [
            "warmup.enabled=true",
            "warmup.tasks=4",
            "warmup.epochs=1",
            "warmup.heldout_episodes=2",
            "eval.episodes=2",
            "eval.every=1",
        ],
    ),
}


def status_mb(field: str) -> float:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+)", text).group(1)) / 1024


def reset_peak() -> None:
    """Reset VmHWM (the peak RSS mark) to the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")


# ---- the model: a random-init SmolLM2 shape ------------------------------------------------


def build_shape(shape: str, out: Path) -> Path:
    """A random-init Llama of SmolLM2-`shape`'s published config with SmolLM2's tokenizer and
    chat template (from the converted 135M folder), saved in bf16 to `out` (once)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (out / "config.json").is_file():
        return out
    config = LlamaConfig(**SMOLLM2_SHAPES[shape], **SMOLLM2_COMMON, head_dim=None)
    config.head_dim = config.hidden_size // config.num_attention_heads
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(DEFAULT_MODEL).save_pretrained(tmp)
    for name in ("chat_template.jinja", "generation_config.json"):
        if (DEFAULT_MODEL / name).is_file():
            shutil.copy(DEFAULT_MODEL / name, tmp / name)
    tmp.replace(out)
    return out


def shaped_model(shape: str) -> Path:
    """The folder of a SmolLM2-`shape` random model, built in a child process (its build
    memory is not this process's)."""
    out = REPO / ".models" / f"random-SmolLM2-{shape}"
    if not (out / "config.json").is_file():
        print(f"building a random-init SmolLM2-{shape} into {out} ...", flush=True)
        subprocess.run(
            [sys.executable, __file__, "--build-shape", shape, "--model", str(out)], check=True
        )
    return out


def parameter_count(model: Path) -> int:
    """Parameters in a model folder (from the safetensors headers: no weights are read)."""
    from agent_core.config.memory_fit import shard_params

    return sum(shard_params(shard) for shard in Path(model).glob("*.safetensors"))


# ---- owners: what the live objects hold ----------------------------------------------------


class Ledger:
    """Bytes by owner, each tensor storage counted once (the first owner that names it)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.owners: dict[str, int] = {}

    def add(self, owner: str, tensors) -> None:
        total = 0
        for t in [inner for given in tensors for inner in _plain(given)]:
            key, size = _storage(t)
            if key not in self.seen:
                self.seen.add(key)
                total += size
        self.owners[owner] = self.owners.get(owner, 0) + total


def _plain(t) -> list:
    """The plain tensors behind `t`: a tensor subclass (torchao's 8-bit optimizer state) holds
    its bytes in inner tensors; none for None."""
    if t is None:
        return []
    if not hasattr(type(t), "__tensor_flatten__"):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [inner for name in names for inner in _plain(getattr(t, name))]


def _storage(t) -> tuple[int, int]:
    """A tensor's storage key and its bytes (an mkldnn-packed weight has no plain storage)."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return id(t), t.numel() * t.element_size()


def trainer_owners(ledger: Ledger, trainer) -> None:
    """The in-process trainer's weights, gradients, optimizer state and reference model."""
    module = trainer.train_engine.module
    params = list(module.parameters())
    ledger.add("trainer weights", params)
    ledger.add("trainer gradients", [p.grad for p in params])
    optimizer = trainer.engine.optimizer
    inner = getattr(optimizer, "optimizer", optimizer)
    moments = [t for s in inner.state.values() for t in s.values() if hasattr(t, "untyped_storage")]
    ledger.add("trainer optimizer state", moments)
    frozen = trainer.reference.frozen
    ledger.add("reference model", list(frozen.parameters()) if frozen is not None else [])


def engine_owners(ledger: Ledger, engine) -> None:
    """The in-process rollout engine's weights, its packed copies and its prefix cache."""
    model = getattr(engine, "model", None)
    if model is None:  # a server engine holds its weights in another process
        return
    ledger.add("engine weights", [*model.parameters(), *model.buffers()])
    backend = engine.backend
    linears = [getattr(backend, "lm_head", None)]
    linears += [lin for layer in getattr(backend, "layers", []) for lin in layer.linears()]
    linears = [lin for lin in linears if lin is not None]
    ledger.add("engine weights", [lin.stacked for lin in linears])
    ledger.add("engine packed weights", [lin.packed for lin in linears])
    cache = getattr(backend, "cache", None)
    ledger.add("engine prefix cache", [e.kv for e in cache.entries.values()] if cache else [])


def live_owners(run_dir: Path) -> dict[str, int]:
    """Bytes by owner of the run's live objects, and of every other tensor Python holds."""
    import torch

    from agent_core import live
    from agent_core.trainer.policy_trainer import PolicyTrainer

    rt = live.runtime_for(run_dir)
    ledger = Ledger()
    if isinstance(rt.trainer, PolicyTrainer):
        trainer_owners(ledger, rt.trainer)
    if rt.engine is not None:
        engine_owners(ledger, rt.engine)
    gc.collect()
    others = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    ledger.add("other tensors", others)
    return ledger.owners


# ---- transients: what a forward keeps for its backward, the KV cache ------------------------


TRANSIENT: dict[str, float] = {}
LARGEST_BATCH: list[int] = [1, 256]  # [rows, positions] of the update's largest micro-batch


def _keep_max(key: str, value: float) -> None:
    TRANSIENT[key] = max(TRANSIENT.get(key, 0.0), value)


@contextmanager
def saved_tensors(vocab: int, weights: dict[int, tuple]):
    """Count what autograd keeps for one backward: logits-sized tensors ([..., vocab]), the
    forward's low-precision copies of weights (autocast), and the rest (activations)."""
    import torch

    kept: dict[int, tuple[str, int]] = {}

    def pack(t):
        key, size = _storage(t)
        if key in weights:
            return t  # a parameter itself: no new bytes
        if t.dim() and t.shape[-1] == vocab:
            kind = "logits"
        elif tuple(t.shape) in weights.values():
            kind = "weight casts"
        else:
            kind = "activations"
        kept.setdefault(key, (kind, size))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield
    for kind in ("logits", "weight casts", "activations"):
        _keep_max(f"kept for backward: {kind}", sum(s for k, s in kept.values() if k == kind))


def instrument(vocab_of) -> None:
    """Wrap the losses' forward+backward, the policy forward and the KV cache allocation so that
    each records its largest size in TRANSIENT."""
    from agent_core.rollout.engines import fused_llama
    from agent_core.trainer import policy_module
    from agent_core.trainer.policy_loss import PolicyLoss
    from agent_core.trainer.supervised import SupervisedLoss

    def counted(fn):
        def wrapper(self, batch, *args, **kwargs):
            params = {_storage(p)[0]: tuple(p.shape) for p in self.engine.module.parameters()}
            with saved_tensors(vocab_of(self.engine), params):
                return fn(self, batch, *args, **kwargs)

        return wrapper

    PolicyLoss.backward = counted(PolicyLoss.backward)
    SupervisedLoss.backward = counted(SupervisedLoss.backward)
    forward = policy_module.PolicyModule.forward

    def policy_forward(self, input_ids, *args, **kwargs):
        out, values = forward(self, input_ids, *args, **kwargs)
        if kwargs.get("head", True):  # else `out` is hidden states: the head runs in chunks
            _keep_max("logits of a micro-batch [tokens x vocab]", out.numel() * out.element_size())
        if input_ids.numel() > TRANSIENT.get("micro-batch positions", 0):
            LARGEST_BATCH[:] = list(input_ids.shape)
        _keep_max("micro-batch positions", float(input_ids.numel()))
        _keep_max("micro-batch response tokens", float(out.shape[0]))
        return out, values

    policy_module.PolicyModule.forward = policy_forward
    empty = fused_llama.FusedLlamaBackend._empty_cache

    def empty_cache(self, rows, slots):
        cache = empty(self, rows, slots)
        _keep_max("engine KV cache", cache.numel() * cache.element_size())
        return cache

    fused_llama.FusedLlamaBackend._empty_cache = empty_cache


# ---- the run, phase by phase ----------------------------------------------------------------


RESULTS: list[dict] = []
RECORDED_PHASES = ("eval", "warmup", "collect", "update", "log")
RECORDED_TRANSIENTS = (
    "engine KV cache",
    "kept for backward: logits",
    "kept for backward: activations",
)
OWNERS: dict[str, dict[str, int]] = {}


def measure(phase: str, iteration: int, run_dir: Path, fn, *args):
    """Run one phase; record its seconds, RSS before/after, peak RSS during it and the owners'
    bytes after it."""
    before = status_mb("VmRSS")
    reset_peak()
    start = time.perf_counter()
    out = fn(*args)
    seconds = time.perf_counter() - start
    peak, after = status_mb("VmHWM"), status_mb("VmRSS")
    RESULTS.append(
        {
            "phase": phase,
            "iteration": iteration,
            "seconds": seconds,
            "before": before,
            "peak": peak,
            "after": after,
        }
    )
    OWNERS[phase] = live_owners(run_dir)
    print(f"  {phase:<13} iter {iteration}: peak {peak:,.0f} MB, after {after:,.0f} MB", flush=True)
    return out


def load(args: argparse.Namespace, root: Path):
    from agent_core.config.load import load_config

    name, settings = PRESET_SETTINGS[args.preset]
    overrides = [
        *settings,
        f"model.path={args.model}",
        "model.source=folder",
        f"run.iterations={args.iterations}",
        f"run.output_dir={root / 'runs'}",
        f"tracking.tracking_uri=sqlite:///{root / 'mlflow.db'}",
        f"rollout.tasks_per_iteration={args.tasks}",
        *args.set,
    ]
    return load_config(name, overrides)


def run(root: Path, args: argparse.Namespace) -> None:
    """The preset's phases in the train flow's order (flows/train.py, without Prefect)."""
    from agent_core.core.run_folder import policy_weights  # noqa: F401 (the flow's imports)
    from agent_core.rollout.shard import shard_count
    from agent_core.run import placement, score, update, warmup, write_replay
    from agent_core.run import report as reporting
    from agent_core.run.evaluate import evaluate_in_training
    from agent_core.run.prepare import finish_run, prepare_run

    cfg = load(args, root)
    describe(cfg)
    run_h = prepare_run(cfg, {})
    run_dir = Path(run_h.run_dir)
    every = cfg.eval.every
    if every and cfg.warmup.enabled:
        measure("eval", 0, run_dir, evaluate_in_training, cfg, run_h, 0, True)
    if cfg.warmup.enabled:
        measure("warmup", 0, run_dir, warmup.warmup, cfg, run_h)
    if every:
        measure("eval", 0, run_dir, evaluate_in_training, cfg, run_h, 0)
    for k in range(run_h.start_iteration, run_h.iterations + 1):
        shards = [
            measure("collect", k, run_dir, placement.collect, cfg, run_h, k, shard)
            for shard in range(shard_count(cfg))
        ]
        batch, r = list(shards), 0
        while cfg.refill.drop:
            judged = measure("judge", k, run_dir, score.judge_groups, cfg, run_h, k, r, batch)
            if not judged.next_shards:
                break
            r += 1
            batch += [
                measure("collect", k, run_dir, placement.collect, cfg, run_h, k, s, r)
                for s in range(judged.next_shards)
            ]
        scored = measure("score", k, run_dir, score.score, cfg, run_h, k, batch)
        partition = measure(
            "write_replay", k, run_dir, write_replay.write_replay, cfg, run_h, k, scored
        )
        updated = measure("update", k, run_dir, update.update, cfg, run_h, k, partition)
        synced = placement.sync(cfg, run_h, k)
        log = reporting.log_iteration
        measure("log", k, run_dir, log, cfg, run_h, k, shards, scored, partition, updated, synced)
        if every and (k % every == 0 or k == run_h.iterations):
            measure("eval", k, run_dir, evaluate_in_training, cfg, run_h, k)
    finish_run(cfg, run_h, "FINISHED")
    return cfg


def describe(cfg) -> None:
    import torch

    r, t = cfg.rollout, cfg.trainer
    lora = f"LoRA r={t.lora.r}" if t.lora else "full fine-tune"
    print(
        f"{cfg.run.name}: {r.tasks_per_iteration} tasks x {r.group_size} samples, up to "
        f"{cfg.env.max_steps} steps of {r.max_new_tokens} new tokens; rollout {r.dtype}; "
        f"trainer {t.dtype}, {lora}, micro-batch {t.micro_batch_size}, gradient checkpointing "
        f"{t.gradient_checkpointing}; {torch.get_num_threads()} torch threads",
        flush=True,
    )


# ---- the baseline: a plain torch AdamW step --------------------------------------------------


def baseline_step(model: Path, shape: list[int], bf16: bool, state: str = "") -> dict:
    """In this (fresh) process: RSS after imports, then the peak over two plain AdamW steps on
    `model` in fp32 (HF's own loss over every position; bf16 autocast when `bf16`) on a batch
    of `shape` [rows, positions]; `state`: steprl's AdamW of that trainer.optimizer_state, and
    the bytes its moments hold."""
    import contextlib
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM

    from agent_core.trainer.optimizers import build_optimizer
    from configs.trainer import TrainerSection

    if state and importlib.util.find_spec("torchao") is not None:
        import torchao  # noqa: F401 (transformers imports it when present: the process's share)
    start = status_mb("VmRSS")
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    if state:
        cfg = TrainerSection(learning_rate=1e-6, optimizer_state=state)
        optimizer = build_optimizer(list(lm.parameters()), cfg)
    else:
        optimizer = torch.optim.AdamW(lm.parameters(), lr=1e-6, fused=True)
    ids = torch.randint(0, lm.config.vocab_size, tuple(shape))
    reset_peak()
    for _ in range(2):
        cast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with cast:
            loss = lm(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    params = sum(p.numel() for p in lm.parameters())
    ledger = Ledger()
    ledger.add(
        "moments", [t for s in optimizer.state.values() for k, t in s.items() if k != "step"]
    )
    moments = ledger.owners["moments"]
    return {"start_mb": start, "peak_mb": status_mb("VmHWM"), "params": params, "moments": moments}


def optimizer_states(model: Path) -> None:
    """Two AdamW steps of a full fine-tune on [4, 256] tokens (bf16 autocast) per
    trainer.optimizer_state, each in a fresh process: its peak and its moments, per parameter
    ('8bit' only where torchao imports)."""
    import importlib.util

    print("\nfull fine-tune steps by trainer.optimizer_state ([4, 256] tokens, bf16 autocast)")
    for state in ("float32", "bfloat16", "8bit"):
        if state == "8bit" and importlib.util.find_spec("torchao") is None:
            print("  8bit: not run here (it needs the optim8bit extra: torchao)")
            continue
        command = [sys.executable, __file__, "--baseline-step", "[4, 256]", "--model", str(model)]
        command += ["--bf16", "--optimizer-state", state]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        found = json.loads(done.stdout.strip().splitlines()[-1])
        peak = per_param(found["peak_mb"] - found["start_mb"], found["params"])
        moments = found["moments"] / found["params"]
        print(f"  {state:<9} peak {peak:5.1f} bytes/param, moments {moments:5.2f} bytes/param")
        figure(f"optimizer_state={state}: step peak bytes/param", round(peak, 1))
        figure(f"optimizer_state={state}: moments bytes/param", round(moments, 2))


def baseline(model: Path, shape: list[int], bf16: bool, glibc_defaults: bool) -> dict:
    command = [
        sys.executable,
        __file__,
        "--baseline-step",
        json.dumps(shape),
        "--model",
        str(model),
    ]
    if bf16:
        command.append("--bf16")
    if glibc_defaults:
        command.append("--glibc-defaults")
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- the report -------------------------------------------------------------------------------


def per_param(mb: float, params: int) -> float:
    return mb * MB / params


def print_phases(start_rss: float, params: int) -> None:
    print(f"\nRSS after imports: {start_rss:,.0f} MB; model parameters: {params / 1e6:,.1f} M")
    print(
        f"{'phase':<13} {'iter':>4} {'seconds':>8} {'RSS before':>11} {'peak RSS':>9} "
        f"{'RSS after':>10} (MB) {'peak B/param':>13} {'after B/param':>14}"
    )
    for r in RESULTS:
        print(
            f"{r['phase']:<13} {r['iteration']:>4} {r['seconds']:8.1f} {r['before']:11,.0f} "
            f"{r['peak']:9,.0f} {r['after']:10,.0f}      "
            f"{per_param(r['peak'] - start_rss, params):13.1f} "
            f"{per_param(r['after'] - start_rss, params):14.1f}"
        )
    top = max(RESULTS, key=lambda r: r["peak"])
    print(f"highest peak: {top['peak']:,.0f} MB in {top['phase']} (iteration {top['iteration']})")
    figure("RSS after imports: GB", round(start_rss / 1024, 2))
    figure("model parameters: M", round(params / 1e6, 1))
    figure("whole run: peak RSS GB", round(top["peak"] / 1024, 2))
    # the record keeps the phases that peak (a compact table in docs/results.md)
    for phase in [p for p in RECORDED_PHASES if any(r["phase"] == p for r in RESULTS)]:
        peak = max(r["peak"] for r in RESULTS if r["phase"] == phase)
        figure(f"{phase}: peak RSS GB", round(peak / 1024, 2))
    for phase in [p for p in ("warmup", "update") if any(r["phase"] == p for r in RESULTS)]:
        peak = max(r["peak"] for r in RESULTS if r["phase"] == phase)
        figure(f"{phase}: peak bytes/param", round(per_param(peak - start_rss, params), 1))


def print_owners(params: int) -> None:
    print("\nbytes by owner after each phase (its last run), MB (bytes/param)")
    names = list(dict.fromkeys(n for owners in OWNERS.values() for n in owners))
    print(f"{'owner':<26}" + "".join(f"{p:>16}" for p in OWNERS))
    for name in names:
        cells = "".join(
            f"{o.get(name, 0) / MB:>8,.0f} ({o.get(name, 0) / params:4.1f})"
            for o in OWNERS.values()
        )
        print(f"{name:<26}{cells}")
    update = OWNERS.get("update", {})
    for name, size in update.items():
        if size / params >= 0.01:
            figure(f"after the update, {name}: bytes/param", round(size / params, 2))
    print("\nlargest transients (MB; bytes/param)")
    for name, size in TRANSIENT.items():
        if name.startswith("micro-batch"):
            print(f"  {name}: {size:,.0f}")
            continue
        print(f"  {name}: {size / MB:,.0f} MB ({size / params:.2f})")
        if name in RECORDED_TRANSIENTS:
            figure(f"largest {name}: bytes/param", round(size / params, 2))


def print_baseline(found: dict, update_peak: float, start_rss: float, params: int) -> None:
    base = per_param(found["peak_mb"] - found["start_mb"], found["params"])
    mine = per_param(update_peak - start_rss, params)
    print(
        f"\nupdate: {mine:.1f} bytes/param; plain torch AdamW step, same model and micro-batch "
        f"shape: {base:.1f} bytes/param (fp32 weights, gradients and moments alone: 16)"
    )
    figure("plain torch AdamW step: peak bytes/param", round(base, 1))
    figure("update / plain AdamW step: bytes/param", round(mine / base, 2))


def print_estimate(cfg) -> None:
    """The load-time estimate (`agent_core.config.memory_fit`, which refuses a run that will not
    fit) of the update's and the rollout's peak beside the measured peaks."""
    from agent_core.config.memory_fit import model_size, phase_estimates

    size = model_size(cfg)
    if size is None:
        return
    print("\nload-time estimate (agent_core/config/memory_fit.py) against the measured peak")
    estimates = {
        phase: sum(owners.values()) / GB for phase, owners in phase_estimates(cfg, size).items()
    }
    for phase, estimate in estimates.items():
        measured = "update" if phase == "checkpoint" else phase  # a LoRA update's last step
        peaks = [r["peak"] / 1024 for r in RESULTS if r["phase"] == measured]
        if peaks:
            print(f"  {phase:<8} estimate {estimate:6.2f} GB, measured {max(peaks):6.2f} GB")
            figure(f"{phase}: measured peak / load-time estimate", round(max(peaks) / estimate, 2))
    whole, estimate = max(r["peak"] for r in RESULTS) / 1024, max(estimates.values())
    print(f"  whole run: estimate {estimate:.2f} GB, measured {whole:.2f} GB")
    figure("whole run: load-time estimate GB", round(estimate, 2))
    figure("whole run: measured peak / load-time estimate", round(whole / estimate, 2))


# ---- main -----------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--preset", choices=sorted(PRESET_SETTINGS), default="demo")
    parser.add_argument("--shape", choices=sorted(SMOLLM2_SHAPES), help="a random SmolLM2 shape")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per iteration")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE config override")
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain AdamW step")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="keep glibc's malloc defaults (the steprl command caps arenas and mmaps tensors)",
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument("--build-shape", help=argparse.SUPPRESS)
    parser.add_argument("--baseline-step", help=argparse.SUPPRESS)
    parser.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--optimizer-state", default="", help=argparse.SUPPRESS)
    parser.add_argument(
        "--optimizer-states",
        action="store_true",
        help="only: a full fine-tune's step and moments per trainer.optimizer_state",
    )
    add_record_option(parser)
    return parser.parse_args()


def main() -> int:
    args = parse()
    if not args.glibc_defaults:
        from agent_core.core.heap import settle_heap

        settle_heap()  # as the steprl command does at its start
    if args.build_shape:
        build_shape(args.build_shape, args.model)
        return 0
    if args.baseline_step:
        shape = json.loads(args.baseline_step)
        print(json.dumps(baseline_step(args.model, shape, args.bf16, args.optimizer_state)))
        return 0
    if args.optimizer_states:
        if args.shape:
            args.model = shaped_model(args.shape)
        if not prepare(args):
            return 0
        optimizer_states(args.model)
        write_record(args, "bfloat16")
        return 0
    if not Path("/proc/self/clear_refs").exists():
        print("skipped: needs Linux /proc (VmHWM and clear_refs) to read per-phase peaks")
        return 0
    if args.smoke:
        args.preset, args.iterations, args.tasks = "smoke", 1, 2
    elif args.shape:
        args.model = shaped_model(args.shape)
    if not prepare(args):
        return 0
    # import torch, transformers, deepspeed, mlflow now: the baseline RSS includes them
    from agent_core.run import report as reporting  # noqa: F401
    from agent_core.run import warmup  # noqa: F401

    instrument(lambda engine: engine.module.lm.get_output_embeddings().weight.shape[0])
    start_rss = status_mb("VmRSS")
    params = parameter_count(args.model)
    home = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # MLflow's sqlite store puts ./mlartifacts next to the working dir
        try:
            cfg = run(Path(tmp), args)
        finally:
            os.chdir(home)
    print_phases(start_rss, params)
    print_owners(params)
    print_estimate(cfg)
    update_peak = max(r["peak"] for r in RESULTS if r["phase"] == "update")
    if not args.no_baseline and cfg.trainer.lora is None:  # the baseline is a full fine-tune
        shape = LARGEST_BATCH
        bf16 = cfg.trainer.dtype != "float32" and _bf16_update(cfg)
        found = baseline(args.model, shape, bf16, args.glibc_defaults)
        print_baseline(found, update_peak, start_rss, params)
    if args.smoke:  # the --optimizer-states path too, on the tiny model
        optimizer_states(args.model)
    write_record(args, "bfloat16" if _bf16_update(cfg) else "float32")
    return 0


def _bf16_update(cfg) -> bool:
    from agent_core.trainer.compute_dtype import resolve_compute_dtype

    return resolve_compute_dtype(cfg.trainer.dtype, "cpu") == "bfloat16"


if __name__ == "__main__":
    sys.exit(main())
