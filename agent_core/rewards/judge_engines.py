"""The engines judge terms generate with: the policy's own rollout engine for `model: policy`
(no second copy of its weights), else one engine per judge model folder, built once per process
and kept (a judge's weights never change).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from agent_core.rewards.judge import JudgeEngine
from agent_core.rollout.build import hf_engine
from agent_core.rollout.engines.hf import HFRolloutEngine
from configs.judge import JUDGE_POLICY
from configs.run_config import RunConfig

_FOLDER_ENGINES: dict[str, HFRolloutEngine] = {}
_GUARD = threading.Lock()


def folder_engine(cfg: RunConfig, folder: str) -> HFRolloutEngine:
    """The process's engine for the judge model `folder` (steprl's own engine, with the run's
    dtype, device and thread settings)."""
    key = str(Path(folder).resolve())
    with _GUARD:
        if key not in _FOLDER_ENGINES:
            _FOLDER_ENGINES[key] = hf_engine(cfg, Path(key))
        return _FOLDER_ENGINES[key]


def judge_engines(
    cfg: RunConfig, policy: Callable[[], JudgeEngine]
) -> Callable[[str], JudgeEngine]:
    """A judge term's `model` -> its engine: `policy()` for 'policy' (called only when a term
    asks for it), else the folder's cached engine."""
    return lambda model: policy() if model == JUDGE_POLICY else folder_engine(cfg, model)
