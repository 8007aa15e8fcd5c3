"""Prefect flows: `train` and `evaluate`, deployments and schedules.

Importing this package sets Prefect's defaults for steprl's runs before Prefect itself loads:
the embedded server sends no telemetry (a run started outside this folder does not read its
prefect.toml, and an offline machine would log a failed heartbeat at every start).
"""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
