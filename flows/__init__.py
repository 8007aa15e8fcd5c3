"""Prefect flows: `train` (and later `evaluate`), deployments and schedules."""
