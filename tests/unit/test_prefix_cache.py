"""The hf engine's prefix cache on a tiny random Llama: an episode's next turn prefills only
its new tokens and samples what an engine without the cache samples (log-probs equal to HF's
own forward over the whole sequence); hits and misses of different lengths share a batch and
its prefill chunks; new weights and `clear_prefix_cache` empty the cache; the byte budget
evicts the least recently used sequence; a sequence never enters twice;
`rollout.prefix_cache_mib` sizes it; a rollout shard reports what prefill ran and what the cache
held, and the iteration's metrics the cache's share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent_core.collect.shard import collect_shard
from agent_core.config.load import load_config
from agent_core.core.results import (
    PartitionResult,
    RunHandle,
    ScoreResult,
    UpdateResult,
)
from agent_core.replay.schema import table_to_steps
from agent_core.replay.store import read_ipc
from agent_core.rollout.build import hf_engine
from agent_core.rollout.engine import Generation, SamplingParams
from agent_core.rollout.engines import prefill
from agent_core.rollout.engines.hf import HFRolloutEngine
from agent_core.rollout.engines.prefix_cache import PrefixCache
from agent_core.run.report import iteration_metrics
from configs.run_config import RunConfig

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)
SAMPLED = SamplingParams(max_new_tokens=8, temperature=1.0, seed=11)
SYSTEM = "<|im_start|>system\nFind the code in six guesses.<|im_end|>\n"
FIRST = [
    "<|im_start|>user\nguess 1<|im_end|>\n",
    "<|im_start|>user\nthe first map, longer<|im_end|>\n",
]
NEXT = "<|im_end|>\n<|im_start|>user\nhint: 2 right<|im_end|>\n<|im_start|>assistant\n"


def make(path: Path, mib: int) -> HFRolloutEngine:
    return HFRolloutEngine(path, threads=1, prefix_cache_mib=mib)


def encode(engine: HFRolloutEngine, text: str) -> list[int]:
    return engine.tokenizer.encode(text, add_special_tokens=False)


def next_turn(engine: HFRolloutEngine, prompt: list[int], gen: Generation) -> list[int]:
    """The prompt an append-only history gives next: prompt, reply as sampled, new feedback."""
    return prompt + gen.token_ids + encode(engine, NEXT)


def hf_logprobs(engine: HFRolloutEngine, prompt: list[int], gen: Generation) -> list[float]:
    """Log-probs of `gen` after `prompt` by HF's own forward over the whole sequence (T = 1)."""
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logps = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])
    return logps.squeeze(-1).tolist()


def assert_same(gens: list[Generation], reference: list[Generation]) -> None:
    """The same ids, and log-probs equal up to float rounding."""
    assert [g.token_ids for g in gens] == [g.token_ids for g in reference]
    for gen, ref in zip(gens, reference, strict=True):
        assert gen.logprobs == pytest.approx(ref.logprobs, abs=1e-5)


@pytest.fixture
def first_prompts(tiny_model_dir: Path) -> list[list[int]]:
    engine = make(tiny_model_dir, 0)
    return [encode(engine, SYSTEM + first) for first in FIRST]


def test_next_turn_prefills_only_its_new_tokens_and_samples_the_same(
    tiny_model_dir, first_prompts
) -> None:
    cached, plain = make(tiny_model_dir, 64), make(tiny_model_dir, 0)
    prompts = [p for p in first_prompts for _ in range(2)]  # groups of 2 equal prompts
    turn1 = cached.generate(prompts, SAMPLED)
    assert [g.token_ids for g in turn1] == [g.token_ids for g in plain.generate(prompts, SAMPLED)]
    turn2 = [next_turn(cached, p, g) for p, g in zip(prompts, turn1, strict=True)]
    before = cached.backend.prefilled_tokens
    gens = cached.generate(turn2, SAMPLED)
    # the last sampled token of turn 1 was never fed, so it and the feedback are what is new
    new = len(encode(cached, NEXT)) + 1
    assert cached.backend.prefilled_tokens - before == new * len(turn2)
    reference = plain.generate(turn2, SAMPLED)
    assert_same(gens, reference)
    for prompt, gen in zip(turn2, gens, strict=True):
        assert gen.logprobs == pytest.approx(hf_logprobs(cached, prompt, gen), abs=1e-4)


def test_hits_and_misses_of_different_lengths_share_a_batch_and_its_chunks(
    tiny_model_dir, first_prompts, monkeypatch
) -> None:
    cached, plain = make(tiny_model_dir, 64), make(tiny_model_dir, 0)
    turn1 = cached.generate(first_prompts, GREEDY)
    hits = [next_turn(cached, p, g) for p, g in zip(first_prompts, turn1, strict=True)]
    window = encode(cached, "<|im_start|>user\nonly the last turn<|im_end|>\n")
    # a miss whose length lies between the two full-history hits: the hits and the window run
    # few tokens and share one prefill chunk although the miss sits between them by length
    miss = encode(cached, SYSTEM + "<|im_start|>user\n")
    while len(miss) < (len(hits[0]) + len(hits[1])) // 2:
        miss += encode(cached, "x")
    assert sorted(map(len, hits))[0] < len(miss) < sorted(map(len, hits))[1]
    batch = [*hits, first_prompts[1] + window, miss]
    few = max(len(encode(cached, NEXT)) + 1, len(window))
    assert len(miss) - prefill.common_prefix(batch) > few
    monkeypatch.setattr(prefill, "_PREFILL_TOKENS", 3 * few)
    reused, forwards = cached.backend.reused_tokens, cached.backend.prefill_forwards
    gens = cached.generate(batch, GREEDY)
    shared, new = prefill.common_prefix(batch), len(encode(cached, NEXT)) + 1
    kept = shared + sum(len(h) - new - shared for h in hits) + len(first_prompts[1]) - shared
    assert cached.backend.reused_tokens - reused >= kept
    assert cached.backend.prefill_forwards - forwards == 2  # hits and window, then the miss
    reference = plain.generate(batch, GREEDY)
    assert_same(gens, reference)


def test_new_weights_empty_the_cache(tiny_model_dir, first_prompts) -> None:
    cached = make(tiny_model_dir, 64)
    turn1 = cached.generate(first_prompts, GREEDY)
    assert cached.backend.cache.entries
    state = {k: v + 0.05 * torch.randn_like(v) for k, v in cached.model.state_dict().items()}
    cached.load_weights(state, policy_version=1)
    assert not cached.backend.cache.entries and cached.backend.cache.bytes == 0
    fresh = make(tiny_model_dir, 0)
    fresh.load_weights(state, policy_version=1)
    turn2 = [next_turn(cached, p, g) for p, g in zip(first_prompts, turn1, strict=True)]
    gens, reference = cached.generate(turn2, GREEDY), fresh.generate(turn2, GREEDY)
    assert_same(gens, reference)


def test_clearing_the_cache_leaves_nothing_to_reuse(tiny_model_dir, first_prompts) -> None:
    """What `run_shard` does before each shard: its rows then depend on its own turns only."""
    cached = make(tiny_model_dir, 64)
    turn1 = cached.generate(first_prompts, GREEDY)
    cached.clear_prefix_cache()
    assert not cached.backend.cache.entries and cached.backend.cache.bytes == 0
    turn2 = [next_turn(cached, p, g) for p, g in zip(first_prompts, turn1, strict=True)]
    before = cached.backend.reused_tokens
    cached.generate(turn2, GREEDY)
    assert cached.backend.reused_tokens == before


def kv(tokens: int) -> torch.Tensor:
    """Keys and values of `tokens` tokens: 2 layers, 1 kv head of 4 dims, 64 bytes a token."""
    return torch.zeros((2, 2, 1, tokens, 4))


def test_budget_evicts_the_least_recently_used_sequence() -> None:
    cache = PrefixCache(budget_bytes=64 * 10)  # 10 tokens
    cache.add([1, 2, 3, 4], kv(4))
    cache.add([5, 6, 7, 8], kv(4))
    assert cache.longest([1, 2, 3, 9])[1] == 3  # [1, 2, 3, 4] is now the most recently used
    cache.add([9, 9, 9, 9], kv(4))  # 12 tokens > 10: [5, 6, 7, 8] leaves
    assert cache.longest([5, 6, 7, 8, 1])[1] == 0
    assert cache.longest([1, 2, 3, 4, 5])[1] == 4
    assert cache.bytes == 64 * 8
    cache.add(list(range(11)), kv(11))  # larger than the whole budget: not kept
    assert cache.longest(list(range(11)))[1] == 0 and cache.bytes == 64 * 8


def test_a_sequence_is_kept_once_and_the_last_token_is_always_run() -> None:
    cache = PrefixCache(budget_bytes=2**20)
    cache.add([1, 2, 3], kv(3))
    cache.add([1, 2], kv(2))  # starts a kept sequence: nothing added
    assert len(cache.entries) == 1
    cache.add([1, 2, 3, 4, 5], kv(5))  # extends it: the shorter one is dropped
    assert len(cache.entries) == 1 and cache.bytes == 64 * 5
    held, n = cache.longest([1, 2, 3, 4, 5])
    assert n == 4 and held.shape[3] == 5  # the prompt's last token is left to run
    assert cache.longest([7])[1] == 0


def test_the_rollout_config_sizes_the_cache(tiny_model_dir) -> None:
    default = hf_engine(RunConfig(), tiny_model_dir)
    assert default.backend.cache.budget_bytes == 1024 * 2**20
    off = RunConfig.model_validate({"rollout": {"prefix_cache_mib": 0}})
    assert hf_engine(off, tiny_model_dir).backend.cache is None


@pytest.mark.parametrize("mib", [64, 0])
def test_a_shard_counts_what_prefill_ran_and_what_the_cache_held(
    tiny_model_dir, tmp_path, mib
) -> None:
    """A multi-turn shard (numberline, full history) reports its prefill's two counts, and the
    iteration's metrics turn them into the cache's share."""
    cfg = load_config(
        "smoke",
        [
            f"model.path={tiny_model_dir}",
            "env.name=numberline",
            "env.max_steps=3",
            f"rollout.prefix_cache_mib={mib}",
        ],
    )
    run = RunHandle(
        run_dir=str(tmp_path),
        mlflow_run_id="",
        base_model=str(tiny_model_dir),
        start_iteration=1,
        iterations=1,
    )
    shard = collect_shard(cfg, run, 1, 0)  # runs the shard and stages its rows
    steps = table_to_steps(read_ipc(Path(shard.path)))
    assert max(s.step_index for s in steps) >= 1, "the shard needs a second turn"
    assert shard.prefilled_tokens > 0
    if mib:
        assert shard.cached_prompt_tokens > 0
    else:
        assert shard.cached_prompt_tokens == 0
    metrics = iteration_metrics(
        [shard, shard],
        ScoreResult(iteration=1, path="", steps=0, trajectories=0, metrics={}, seconds=0.0),
        PartitionResult(iteration=1, path="", rows=0, sha256="", seconds=0.0),
        UpdateResult(iteration=1, policy_version=1, checkpoint="", metrics={}, seconds=0.0),
    )
    assert metrics["rollout/prefilled_tokens"] == 2 * shard.prefilled_tokens
    assert metrics["rollout/prefix_cache_tokens"] == 2 * shard.cached_prompt_tokens
    total = shard.prefilled_tokens + shard.cached_prompt_tokens
    assert metrics["rollout/prefix_cache_share"] == pytest.approx(
        shard.cached_prompt_tokens / total
    )
