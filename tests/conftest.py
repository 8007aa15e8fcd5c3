"""Shared fixtures: offline Hugging Face, a tiny random model folder, one Prefect test harness."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Nothing in the tests may reach a model hub or send telemetry.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-init Llama with a byte-level ChatML tokenizer (built, not downloaded)."""
    from agent_core.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", hidden_size=64, layers=2)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect API for the whole session (it costs ~20 s to start)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
