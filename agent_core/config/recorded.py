"""The config a checkpoint is served with: by default the one its run recorded
(`<run>/config.yaml`), so the policy sees prompts rendered as in training; else a preset.
"""

from __future__ import annotations

from pathlib import Path

from agent_core.config.load import load_config
from agent_core.core.run_folder import CHECKPOINTS, config_file, run_dir_of
from configs.run_config import RunConfig

DEFAULT_PRESET = "calculator_grpo"  # what serve-policy serves when nothing names a run


def serving_config(
    preset: str | None, checkpoint: str, overrides: list[str], run_config: bool = True
) -> tuple[RunConfig, str]:
    """(the config to serve `checkpoint` with, where it came from). By default that is the
    config its run recorded (`<run>/config.yaml`), so the policy sees prompts rendered as in
    training (env.tool_prompt, rollout.max_prompt_tokens): the run folder holding a checkpoint
    folder `<run>/checkpoints/iter_k`, else the run `preset` names. `preset` (default
    calculator_grpo) alone serves a model folder of no run, or any with `run_config` off."""

    folder = Path(checkpoint)
    recorded = None
    if folder.parent.name == CHECKPOINTS and config_file(folder.parent.parent).is_file():
        recorded = config_file(folder.parent.parent)
    elif checkpoint in ("latest", "base") or checkpoint.isdigit() or checkpoint.startswith("iter_"):
        run_dir = run_dir_of(load_config(preset or DEFAULT_PRESET, overrides))
        recorded = config_file(run_dir) if config_file(run_dir).is_file() else None
    if run_config and recorded is not None:
        return load_config(recorded, overrides), str(recorded)
    return load_config(preset or DEFAULT_PRESET, overrides), f"preset {preset or DEFAULT_PRESET}"
