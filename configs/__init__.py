"""Configuration of a steprl run: `RunConfig` (run_config.py) with one pydantic module per YAML
section (run.py, model.py, env.py, rollout.py, reward.py, algorithm.py, trainer.py, ...), and
the YAML presets (*.yaml) with the data files they name (data/)."""
