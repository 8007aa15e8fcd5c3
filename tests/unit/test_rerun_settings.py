"""A rerun of a run folder with other settings says which ones changed (the run goes on with
the new ones), and a rerun with nothing left to do says how to get more iterations."""

from __future__ import annotations

from pathlib import Path

from agent_core.config import changed_settings, dump_config, load_config
from flows.train import TrainSummary, where_to_look

TINY = ["model.source=tiny-random"]


def test_changed_settings_name_key_old_and_new_but_not_the_iteration_count(
    tmp_path: Path,
) -> None:
    recorded = tmp_path / "config.yaml"
    assert changed_settings(recorded, load_config(None, TINY)) == []  # a new run folder
    recorded.write_text(dump_config(load_config(None, TINY)))
    more = load_config(None, [*TINY, "run.iterations=9", "run.continue_for=2"])
    assert changed_settings(recorded, more) == []
    other = load_config(None, [*TINY, "env.name=numberline", "trainer.learning_rate=0.001"])
    changed = changed_settings(recorded, other)
    assert "env.name: calculator -> numberline" in changed
    assert any(c.startswith("trainer.learning_rate: ") and c.endswith("-> 0.001") for c in changed)
    assert all(not c.startswith("run.iterations") for c in changed)
    recorded.write_text("run: {name: [unclosed")  # a hand edit gone wrong
    assert changed_settings(recorded, other) == [
        "config.yaml: unreadable, so unknown (ParserError)"
    ]


def test_a_rerun_with_nothing_left_says_how_to_go_on() -> None:
    cfg = load_config(None, TINY)
    done = TrainSummary(run_dir="runs/x", mlflow_run_id="r", iterations_run=[], last_metrics={})
    message = where_to_look(cfg, done)
    assert "nothing to run" in message and "run.continue_for" in message
    ran = done.model_copy(update={"iterations_run": [1, 2]})
    assert "nothing to run" not in where_to_look(cfg, ran)
