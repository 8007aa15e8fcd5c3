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
