"""How agent-function episodes ended, as iteration metrics, and the share of failed episodes
past which an iteration fails instead of training on the rest."""

from __future__ import annotations

import pytest

from agent_core.serving.episodes import check_failed_share, episode_metrics

SHARDS = [
    (4, {"answer": 3, "timeout": 1}, {"1:t:3": "timeout: timed out after 10 s"}),
    (4, {"agent": 2, "agent_error": 1, "refused": 1}, {"1:u:0": "agent: no call was answered"}),
]


def test_episode_ends_and_lost_episodes_are_counted() -> None:
    assert episode_metrics(SHARDS) == {
        "rollout/episodes_answer": 3, "rollout/episodes_timeout": 1,
        "rollout/episodes_agent": 2, "rollout/episodes_agent_error": 1,
        "rollout/episodes_refused": 1, "rollout/episodes_lost": 2,
    }  # fmt: skip
    assert episode_metrics([(8, {}, {})]) == {}  # an env loop's shards: no agent metrics


def test_an_iteration_that_lost_too_many_episodes_fails_loudly() -> None:
    # failed: timeout, agent_error, refused, and the episode that ended well without a row
    check_failed_share(SHARDS, 0.5, 3)
    with pytest.raises(RuntimeError, match=r"iteration 3: 4 of 8 agent episodes failed"):
        check_failed_share(SHARDS, 0.25, 3)
    check_failed_share([(8, {}, {})], 0.0, 3)


def test_scoring_refuses_an_iteration_that_lost_too_many(tmp_path) -> None:
    """The check sits in the score phase, before any row is read or trained on."""
    from agent_core.config.load import load_config
    from agent_core.core.results import RunHandle, ShardResult
    from agent_core.run.score import score

    cfg = load_config("smoke", ["env.agent_max_failed_share=0.25"])
    run = RunHandle(run_dir=str(tmp_path), mlflow_run_id="r", base_model="m",
                    start_iteration=1, iterations=1)  # fmt: skip
    shards = [
        ShardResult(iteration=2, shard=i, path=str(tmp_path / "missing.arrow"), episodes=n,
                    steps=0, generate_calls=0, generated_tokens=0, prompt_tokens=0,
                    generate_seconds=0.0, seconds=0.0, episode_ends=ends, lost_episodes=lost)
        for i, (n, ends, lost) in enumerate(SHARDS)
    ]  # fmt: skip
    with pytest.raises(RuntimeError, match=r"agent_max_failed_share=0\.25"):
        score(cfg, run, 2, shards)
