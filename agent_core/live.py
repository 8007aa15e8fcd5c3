"""Live objects of a run inside one process: the rollout engine and the trainer.

Loading a model or building a DeepSpeed engine costs seconds, so each is built once per process
and reused across iterations; the in-process rollout engine takes the trainer's weights in
memory after each update, a server engine (remote, vllm) has its server load the checkpoint
folder. A fresh process (a resumed run) rebuilds both from the latest checkpoint.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent_core.rollout.engines.hf import HFRolloutEngine
from agent_core.rollout.engines.remote import RemoteRolloutEngine, RemoteSettings
from agent_core.trainer.policy_trainer import PolicyTrainer
from agent_core.workers.trainer_group import TrainerGroup
from configs.run_config import RunConfig

Engine = HFRolloutEngine | RemoteRolloutEngine


@dataclass
class RunRuntime:
    """The cached engine and trainer of one run folder, with the policy version each holds."""

    engine: Engine | None = None
    trainer: PolicyTrainer | TrainerGroup | None = None
    trainer_version: int = -1
    lock: threading.Lock = field(default_factory=threading.Lock)


_RUNTIMES: dict[str, RunRuntime] = {}
_GUARD = threading.Lock()


def runtime_for(run_dir: Path) -> RunRuntime:
    """The process-wide runtime of `run_dir`."""
    key = str(Path(run_dir).resolve())
    with _GUARD:
        return _RUNTIMES.setdefault(key, RunRuntime())


def release(run_dir: Path) -> None:
    """Drop a run's cached engine and trainer (frees their memory; stops trainer ranks)."""
    with _GUARD:
        rt = _RUNTIMES.pop(str(Path(run_dir).resolve()), None)
    if rt is not None and isinstance(rt.trainer, TrainerGroup):
        rt.trainer.stop()
    if rt is not None and isinstance(rt.engine, RemoteRolloutEngine):
        rt.engine.close()  # stops the vLLM server steprl started


def wants_cuda(accelerator: str) -> bool:
    import torch

    return accelerator == "cuda" or (accelerator == "auto" and torch.cuda.is_available())


def new_engine(cfg: RunConfig, weights: Path) -> Engine:
    """A rollout engine of kind `rollout.engine` holding the `weights` folder (close it with
    `close_engine` when it is not a run's cached one)."""
    return ENGINES[cfg.rollout.engine](cfg, weights)


def close_engine(engine: Engine) -> None:
    """Free what an engine holds outside this process (a server steprl started)."""
    if isinstance(engine, RemoteRolloutEngine):
        engine.close()


def hf_engine(cfg: RunConfig, weights: Path) -> HFRolloutEngine:
    """steprl's own engine for `weights` with the run's rollout settings."""
    return HFRolloutEngine(
        weights,
        cfg.rollout.dtype,
        "cuda" if wants_cuda(cfg.trainer.accelerator) else "cpu",
        cfg.rollout.threads,
        fused=cfg.rollout.fused_forward,
        share_prefix=cfg.rollout.share_prompt_prefix,
        pack_weights=cfg.rollout.pack_weights,
    )


def remote_engine(cfg: RunConfig, weights: Path) -> RemoteRolloutEngine:
    """A client of the server at rollout.remote.base_url, which is made to load `weights`
    (whatever it held before) unless it cannot reload."""
    r = cfg.rollout.remote
    api_key = os.environ.get(r.api_key_env, "") if r.api_key_env else ""
    if r.api_key_env and not api_key:
        raise ValueError(f"rollout.remote.api_key_env={r.api_key_env!r}: that variable is empty")
    settings = RemoteSettings(
        base_url=r.base_url,
        model=r.model,
        api_key=api_key,
        timeout_s=r.timeout_s,
        max_concurrency=r.max_concurrency,
        prompts_per_request=r.prompts_per_request,
        send_seed=r.send_seed,
        weight_sync=r.weight_sync,
    )
    engine = RemoteRolloutEngine(settings, weights)
    if r.weight_sync != "none":
        engine.load_checkpoint(weights, 0)
    return engine


def vllm_engine(cfg: RunConfig, weights: Path) -> RemoteRolloutEngine:
    """A vLLM server started on `weights` (stopped when the engine closes) and its client."""
    from agent_core.rollout.engines.vllm_server import VLLMServer

    v = cfg.rollout.vllm
    server = VLLMServer(v, weights, cfg.rollout.dtype, cfg.run.seed)
    try:
        settings = RemoteSettings(
            base_url=server.base_url,
            model=server.served_name,
            timeout_s=v.timeout_s,
            max_concurrency=v.max_concurrency,
            prompts_per_request=v.prompts_per_request,
            send_seed=False,  # one seed for a whole request: a group's samples would be equal
            weight_sync="vllm",
        )
        return RemoteRolloutEngine(settings, weights, server)
    except BaseException:
        server.stop()
        raise


ENGINES: dict[str, Callable[[RunConfig, Path], Engine]] = {
    "hf": hf_engine,
    "remote": remote_engine,
    "vllm": vllm_engine,
}


def rollout_engine(cfg: RunConfig, run_dir: Path, version: int, weights: Path) -> Engine:
    """An engine holding policy `version`: the cached one, synced from a live trainer, or
    loaded from the `weights` folder."""
    return engine_at(cfg, run_dir, version, weights, None)


def folder_state_dict(folder: Path) -> dict:
    """The weights of an HF checkpoint folder (every safetensors shard in it)."""
    from safetensors.torch import load_file

    state: dict = {}
    for shard in sorted(Path(folder).glob("model*.safetensors")):  # not value_head.*
        state |= load_file(shard)
    if not state:
        raise FileNotFoundError(f"no model*.safetensors weights in {folder}")
    return state


def engine_at(
    cfg: RunConfig, run_dir: Path, version: int, weights: Path, state: dict | None
) -> Engine:
    """The process's engine made to hold policy `version`: kept if it does, else given the
    weights (`state` when given, a live trainer's, or the `weights` folder's; a server engine
    always reloads the folder) without rebuilding it; built from `weights` when there is no
    engine yet."""
    rt = runtime_for(run_dir)
    with rt.lock:
        engine = rt.engine
        if engine is not None and engine.policy_version == version:
            return engine
        if engine is None:
            rt.engine = new_engine(cfg, weights)
            rt.engine.policy_version = version
            return rt.engine
        if isinstance(engine, RemoteRolloutEngine):
            engine.load_checkpoint(weights, version)
            return engine
        if state is None and rt.trainer is not None and rt.trainer_version == version:
            state = rt.trainer.lm_state_dict()
        engine.load_weights(state if state is not None else folder_state_dict(weights), version)
        return engine


def needs_reference(cfg: RunConfig) -> bool:
    """Whether a frozen reference model is needed (KL in the loss or in the reward)."""
    return cfg.trainer.kl_loss_coef > 0 or cfg.algorithm.kl_coef > 0


def policy_trainer(
    cfg: RunConfig, run_dir: Path, version: int, weights: Path, base: Path
) -> PolicyTrainer | TrainerGroup:
    """A trainer at policy `version`: the cached one, or built from the `weights` checkpoint
    folder (restoring its DeepSpeed optimizer state when saved). The base model is the
    reference when a KL term needs one."""
    rt = runtime_for(run_dir)
    with rt.lock:
        if rt.trainer is not None and rt.trainer_version == version:
            return rt.trainer
        if isinstance(rt.trainer, TrainerGroup):
            rt.trainer.stop()  # trainer ranks at another version: start them afresh
        rt.trainer = build_trainer(cfg, weights, base if needs_reference(cfg) else None)
        rt.trainer_version = version
        return rt.trainer


def build_trainer(cfg: RunConfig, weights: Path, reference: Path | None):
    """A trainer at the `weights` folder with its DeepSpeed optimizer state restored when
    the folder holds some: in this process, or `trainer.ranks` Ray actors behaving as one."""
    t = cfg.trainer
    if t.ranks > 1:
        return TrainerGroup(cfg, weights, cfg.rollout.temperature, cfg.run.seed, reference)
    trainer = PolicyTrainer(weights, t, cfg.rollout.temperature, cfg.run.seed, reference)
    trainer.load_state(weights)  # optimizer state, when the folder is a checkpoint
    return trainer


def trained_weights_ref(run_dir: Path, version: int):
    """An object-store reference to policy `version` held by this process's live trainer
    (put once, read by every rollout worker), or None without such a trainer."""
    rt = runtime_for(run_dir)
    with rt.lock:
        if rt.trainer is None or rt.trainer_version != version:
            return None
        if isinstance(rt.trainer, TrainerGroup):
            return rt.trainer.weights_ref()
        import ray

        return ray.put(rt.trainer.lm_state_dict())


def mark_trained(run_dir: Path, version: int) -> None:
    """Record that the cached trainer now holds policy `version` and give an in-process engine
    its weights (a server engine reloads the checkpoint folder in the sync phase)."""
    rt = runtime_for(run_dir)
    with rt.lock:
        rt.trainer_version = version
        if isinstance(rt.engine, HFRolloutEngine) and rt.trainer is not None:
            rt.engine.load_weights(rt.trainer.lm_state_dict(), version)


def sync_server_engine(cfg: RunConfig, run_dir: Path, version: int, weights: Path) -> float:
    """Have a cached server engine's server load the checkpoint folder `weights` of policy
    `version`; returns the seconds the reload took (0.0 without such an engine: the next
    rollout builds one at the right version)."""
    rt = runtime_for(run_dir)
    if not isinstance(rt.engine, RemoteRolloutEngine):
        return 0.0
    engine_at(cfg, run_dir, version, weights, None)
    return rt.engine.sync_seconds[-1] if rt.engine.sync_seconds else 0.0


def return_free_memory() -> None:
    """Hand freed heap pages back to the OS. glibc keeps memory freed by an update (activations,
    logits, checkpoint copies) in its per-thread arenas, so the process's resident size would
    stay at the update's peak through the next rollout; elsewhere this does nothing."""
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: not glibc
        ctypes.CDLL(None).malloc_trim(0)  # the process's own symbols: no library lookup
