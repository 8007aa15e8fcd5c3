"""Where the presets (`configs/*.yaml`) and the shipped data (`configs/data`) live, a preset name
or YAML path resolved to its file, and the error a config that cannot be loaded raises.
"""

from __future__ import annotations

from pathlib import Path

PRESETS_DIR = Path(__file__).resolve().parents[2] / "configs"


SHIPPED_DATA = PRESETS_DIR / "data"


class ConfigError(ValueError):
    """An invalid configuration; the message lists each bad field and its fix."""


def preset_path(name_or_path: str | Path) -> Path:
    """A YAML file path, or the preset `configs/<name>.yaml` for a bare name."""
    path = Path(name_or_path)
    if path.suffix in {".yaml", ".yml"} or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        return path
    preset = PRESETS_DIR / f"{name_or_path}.yaml"
    if not preset.is_file():
        known = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")))
        raise ConfigError(f"unknown preset {name_or_path!r}: choose one of {known} or give a path")
    return preset
