"""bench/trees.py --report: the figures of two finished runs, read from their folders, with
nothing trained and no model folder needed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agent_core.core.measurements import read_measurement
from tests.conftest import REPO


def fake_run(run_dir: Path, tokens: list[int], success: dict[int, float]) -> None:
    """A run folder as `steprl train` leaves it, as far as the bench reads it: per iteration
    its log record and one shard record (4 tokens per episode); per evaluation its result."""
    for k, generated in enumerate(tokens, start=1):
        folder = run_dir / f"iter_{k:04d}"
        (folder / "rollouts").mkdir(parents=True)
        timing = {"timing_s/collect": 2.0, "timing_s/update": 3.0, "timing_s/eval": 50.0}
        (folder / "logged.json").write_text(json.dumps({"metrics": timing}))
        shard = {"generated_tokens": generated, "episodes": generated // 4}
        (folder / "rollouts" / "shard_000.json").write_text(json.dumps(shard))
    for k, rate in success.items():
        folder = run_dir / "eval" / f"iter_{k:04d}"
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps({"metrics": {"eval/success_rate": rate}}))


def run_report(monkeypatch: pytest.MonkeyPatch, runs: Path, record: Path) -> None:
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import trees

    def no_training(name, *args):
        raise AssertionError(f"--report trained {name}")

    monkeypatch.setattr(trees, "train", no_training)
    argv = ["trees.py", "--env", "choice", "--report", "--runs", str(runs), "--record"]
    monkeypatch.setattr(sys, "argv", [*argv, str(record)])
    monkeypatch.setattr(trees, "DEFAULT_MODEL", runs / "no-model-here")
    assert trees.main() == 0


def test_report_reads_both_runs_and_trains_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_run(tmp_path / "trees-choice-s1-chain", [16, 20], {0: 0.5, 8: 0.25})
    fake_run(tmp_path / "trees-choice-s1-tree", [16, 16], {0: 0.5, 8: 0.75})
    run_report(monkeypatch, tmp_path, tmp_path / "record.json")
    figures = read_measurement(tmp_path / "record.json").figures
    assert figures["chain: generated tokens per iteration, mean"] == 18.0
    assert figures["tree: episodes per iteration, mean"] == 4.0
    assert figures["chain: seconds per iteration, mean"] == 5.0  # held-out eval left out
    assert figures["tree: held-out iter 8"] == 0.75
    assert figures["tree / chain: tokens"] == round(32 / 36, 4)
    # the budget the bench gives the tree arm: 4 tokens per episode x (4 - 2 trees / 2)
    assert figures["tree: token budget per task"] == 12
    assert not any("load average" in name for name in figures)


def test_report_refuses_a_run_that_logged_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_run(tmp_path / "trees-choice-s1-chain", [16], {0: 0.5})
    (tmp_path / "trees-choice-s1-tree").mkdir()
    with pytest.raises(SystemExit, match=r"no logged iteration in .*trees-choice-s1-tree"):
        run_report(monkeypatch, tmp_path, tmp_path / "record.json")
