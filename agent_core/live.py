"""Live objects of a run inside one process: the rollout engine and the trainer.

Loading a model or building a DeepSpeed engine costs seconds, so each is built once per process
and reused across iterations; the in-process rollout engine takes the trainer's weights in
memory after each update, a server engine (remote, vllm) has its server load the checkpoint
folder. A fresh process (a resumed run) rebuilds both from the latest checkpoint. Which trainer
is built (in this process or as Ray trainer ranks) is `run.trainers`' choice; here it is only
held.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from agent_core.rollout.build import Engine, folder_state_dict, new_engine
from agent_core.rollout.engines.hf import HFRolloutEngine
from agent_core.rollout.engines.remote import RemoteRolloutEngine
from configs.run_config import RunConfig


class HeldTrainer(Protocol):
    """What the live objects ask of a trainer: an in-process `PolicyTrainer` or the Ray
    trainer ranks of a `TrainerGroup`."""

    def lm_state_dict(self) -> dict: ...

    def stop(self) -> None: ...


@dataclass
class RunRuntime:
    """The cached engine and trainer of one run folder, with the policy version each holds,
    and the demonstrations the RL updates train on beside their rows."""

    engine: Engine | None = None
    trainer: HeldTrainer | None = None
    trainer_version: int = -1
    # the warm-up's demonstration rows (TrainRow), read once per process when
    # trainer.demonstration_loss_coef trains every update on them
    demonstrations: list | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    # held by whoever samples with the engine (a collect, a training eval, a policy judge), so
    # that with overlap on no thread swaps its weights while another generates
    use_lock: threading.RLock = field(default_factory=threading.RLock)


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
    if rt is not None and rt.trainer is not None:
        rt.trainer.stop()  # trainer ranks end; an in-process trainer holds no process
    if rt is not None and isinstance(rt.engine, RemoteRolloutEngine):
        rt.engine.close()  # stops the vLLM server steprl started


def engine_use(run_dir: Path) -> threading.RLock:
    """The lock to hold while sampling with the run's engine (`with live.engine_use(dir):`)."""
    return runtime_for(run_dir).use_lock


def rollout_engine(cfg: RunConfig, run_dir: Path, version: int, weights: Path) -> Engine:
    """An engine holding policy `version`: the cached one, synced from a live trainer, or
    loaded from the `weights` folder. With overlap on, a live trainer may be mid-update in
    another thread: the weights then come from the committed folder only."""
    return engine_at(cfg, run_dir, version, weights, None, cfg.overlap.max_staleness == 0)


def engine_at(
    cfg: RunConfig,
    run_dir: Path,
    version: int,
    weights: Path,
    state: dict | None,
    from_trainer: bool = True,
) -> Engine:
    """The process's engine made to hold policy `version`: kept if it does, else given the
    weights (`state` when given, a live trainer's when `from_trainer`, or the `weights`
    folder's; a server engine always reloads the folder) without rebuilding it; built from
    `weights` when there is no engine yet."""
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
        if (
            state is None
            and from_trainer
            and rt.trainer is not None
            and rt.trainer_version == version
        ):
            state = rt.trainer.lm_state_dict()
        if state is None:
            state = folder_state_dict(weights, getattr(engine, "adapter_names", ()))
        engine.load_weights(state, version)
        return engine


def mark_trained(run_dir: Path, version: int, to_engine: bool = True) -> None:
    """Record that the cached trainer now holds policy `version` and, when `to_engine`, give an
    in-process engine its weights (a server engine reloads the checkpoint folder in the sync
    phase; with overlap on, a collection takes the committed folder at its next turn)."""
    rt = runtime_for(run_dir)
    with rt.lock:
        rt.trainer_version = version
        if to_engine and isinstance(rt.engine, HFRolloutEngine) and rt.trainer is not None:
            rt.engine.load_weights(rt.trainer.lm_state_dict(), version)


def engine_takes_trainer_weights(run_dir: Path, version: int) -> None:
    """A trainer of policy `version` was just built in this process: an in-process engine that
    holds the same policy in fp32 takes the trainer's weights, shared (`load_weights`), so the
    process holds the plain weights once from the update on (the engine keeps its packed
    copy). Only for a sequential run's in-process full fine-tune: with overlap on, the engine
    samples while the trainer changes its weights."""
    rt = runtime_for(run_dir)
    with rt.lock:
        engine = rt.engine
        if not isinstance(engine, HFRolloutEngine) or rt.trainer is None:
            return
        if engine.policy_version != version or rt.trainer_version != version:
            return
        if engine.model.dtype == torch.float32:  # another dtype would be a cast copy
            engine.load_weights(rt.trainer.lm_state_dict(), version)


def free_engine_caches(run_dir: Path) -> None:
    """Before a sequential run's update: the in-process engine forgets the keys and values of
    earlier calls and frees its packed copy of the weights until its next generate (the
    update's new weights would replace both anyway), and the freed heap goes back to the OS,
    so the update's peak does not stack on the rollout's caches."""
    rt = runtime_for(run_dir)
    if isinstance(rt.engine, HFRolloutEngine):
        rt.engine.drop_weight_copies()
    return_free_memory()


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
    stay at the update's peak through the next rollout; elsewhere this does nothing. Garbage
    in reference cycles is collected first: a dropped trainer or engine whose objects refer to
    each other would otherwise hold its tensors until Python's collector next runs."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: not glibc
        ctypes.CDLL(None).malloc_trim(0)  # the process's own symbols: no library lookup
