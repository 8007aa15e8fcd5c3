"""The config a run records: as YAML beside its data (`config.yaml`), as dotted keys (MLflow
params), and which settings a rerun changed against the recorded file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from configs.run_config import RunConfig


def dump_config(config: RunConfig) -> str:
    """The config as YAML (what a run records next to its data)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def flatten(config: RunConfig | dict[str, Any]) -> dict[str, str]:
    """Dotted-key view of the config or of its dump (MLflow params)."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else key, sub)
        else:
            out[prefix] = str(value)

    walk("", config if isinstance(config, dict) else config.model_dump(mode="json"))
    return out


RESUMABLE = ("run.iterations", "run.continue_for")  # settings a rerun changes to go on


def changed_settings(recorded: Path, config: RunConfig) -> list[str]:
    """`key: old -> new` for each setting that differs from a run folder's recorded config
    (`dump_config`'s file), apart from how many iterations to run; none for a new run
    folder, and one line saying so when the recorded file cannot be read (it is written
    atomically, but may have been edited by hand)."""
    if not recorded.is_file():
        return []
    try:
        loaded = yaml.safe_load(recorded.read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        return [f"{recorded.name}: unreadable, so unknown ({type(exc).__name__})"]
    old = flatten(loaded if isinstance(loaded, dict) else {})
    new = flatten(config)
    return [
        f"{key}: {old.get(key, '(unset)')} -> {new.get(key, '(unset)')}"
        for key in sorted(old.keys() | new.keys())
        if key not in RESUMABLE and old.get(key) != new.get(key)
    ]
