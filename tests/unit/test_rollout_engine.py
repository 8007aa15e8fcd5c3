"""HFRolloutEngine on a tiny random Llama: batching, padding and prefix sharing change nothing
(same greedy ids, teacher-forced log-probs), per-sequence stops, finished rows leave the batch,
seeded determinism, and the inverse-CDF / nucleus sampler draws from the right distribution."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent_core.rollout.engine import Generation, SamplingParams
from agent_core.rollout.engines import prefill, sampler
from agent_core.rollout.engines.fused_llama import FusedLlamaBackend
from agent_core.rollout.engines.hf import HFRolloutEngine
from agent_core.rollout.engines.hf_cache import HFCacheBackend

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
SYSTEM = "<|im_start|>system\nYou are a careful calculator agent.<|im_end|>\n"
QUESTIONS = ["hi", "what is 2 + 3?", "a much longer question about 17 * 23, please", "ok"]


def make(path: Path, **kwargs) -> HFRolloutEngine:
    """One torch thread: on a busy 2-core box, two threads make tiny ops ~30x slower."""
    return HFRolloutEngine(path, threads=1, **kwargs)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> HFRolloutEngine:
    return make(tiny_model_dir)


@pytest.fixture(scope="module")
def prompts(engine: HFRolloutEngine) -> list[list[int]]:
    """Chat-like prompts of different lengths sharing a system-prompt prefix."""
    encode = engine.tokenizer.encode
    return [encode(SYSTEM + q, add_special_tokens=False) for q in QUESTIONS]


def teacher_forced(engine: HFRolloutEngine, prompt: list[int], gen: Generation, t: float):
    """Log-probs [R] of `gen` and the logits [R, V] that predicted it, by HF's own forward."""
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    scaled = logits / t if t > 0 else logits
    logps = torch.log_softmax(scaled, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
    return logps, logits


def test_uses_the_fused_backend_for_llama_and_hf_otherwise(tiny_model_dir, engine) -> None:
    assert isinstance(engine.backend, FusedLlamaBackend) and engine.backend.share_prefix
    assert isinstance(make(tiny_model_dir, fused=False).backend, HFCacheBackend)


@pytest.mark.parametrize("fused", [True, False])
def test_batched_greedy_equals_one_prompt_at_a_time(tiny_model_dir, prompts, fused) -> None:
    engine = make(tiny_model_dir, fused=fused)
    batched = engine.generate(prompts, GREEDY)
    single = [engine.generate([p], GREEDY)[0] for p in prompts]
    assert [g.token_ids for g in batched] == [g.token_ids for g in single]
    for b, s in zip(batched, single, strict=True):
        assert b.logprobs == pytest.approx(s.logprobs, abs=1e-5)


def test_fused_prefix_sharing_and_chunking_change_nothing(tiny_model_dir, prompts, monkeypatch):
    reference = make(tiny_model_dir, fused=False).generate(prompts, GREEDY)
    plain = make(tiny_model_dir, share_prefix=False, pack_weights=False)
    monkeypatch.setattr(prefill, "_PREFILL_TOKENS", 40)  # several prefill chunks
    chunked = make(tiny_model_dir)
    for engine in (plain, chunked):
        gens = engine.generate(prompts, GREEDY)
        assert [g.token_ids for g in gens] == [g.token_ids for g in reference]
        for g, r in zip(gens, reference, strict=True):
            assert g.logprobs == pytest.approx(r.logprobs, abs=1e-5)
    assert chunked.backend.prefill_forwards > 2  # the prefix, then more than one chunk


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_equal_teacher_forced_forward(engine, prompts, temperature) -> None:
    params = SamplingParams(max_new_tokens=10, temperature=temperature, seed=5)
    for prompt, gen in zip(prompts, engine.generate(prompts, params), strict=True):
        assert len(gen.token_ids) == len(gen.logprobs) == 10 and gen.finish_reason == "length"
        expected, logits = teacher_forced(engine, prompt, gen, temperature)
        assert gen.logprobs == pytest.approx(expected.tolist(), abs=1e-4)
        if temperature == 0.0:  # greedy: every token is the argmax of the model's logits
            assert gen.token_ids == logits.argmax(-1).tolist()


def test_seeded_sampling_is_reproducible_and_duplicates_sample_independently(engine, prompts):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=11)
    batch = [prompts[1]] * 6 + prompts
    first = engine.generate(batch, params)
    assert first == engine.generate(batch, params)
    assert first != engine.generate(batch, SamplingParams(max_new_tokens=8, seed=12))
    # identical prompts share one prefill, yet each row draws its own sample
    assert len({tuple(g.token_ids) for g in first[:6]}) > 1


def test_eos_stops_each_sequence_and_finished_rows_leave_the_batch(tiny_model_dir, prompts):
    engine = make(tiny_model_dir)
    free = engine.generate(prompts, GREEDY)
    eos = free[2].token_ids[3]  # make a token the greedy path of prompt 2 emits an EOS
    engine.eos_ids = {eos}
    sizes: list[int] = []
    step = engine.backend.step
    engine.backend.step = lambda tokens: sizes.append(len(tokens)) or step(tokens)
    gens = engine.generate(prompts, GREEDY)
    for gen, full in zip(gens, free, strict=True):
        if eos in full.token_ids:
            cut = full.token_ids.index(eos) + 1
            assert gen.token_ids == full.token_ids[:cut] and gen.finish_reason == "eos"
        else:
            assert gen.token_ids == full.token_ids and gen.finish_reason == "length"
    ended = [len(g.token_ids) for g in gens if g.finish_reason == "eos"]
    assert ended and max(ended) < GREEDY.max_new_tokens
    # one forward per decoding step over the rows still running: a row that ended at step k
    # is not in the forward that follows it
    live = [sum(len(g.token_ids) > k + 1 for g in gens) for k in range(GREEDY.max_new_tokens - 1)]
    assert sizes == [n for n in live if n > 0] and sizes[-1] < len(prompts)


def test_stop_strings_stop_each_sequence_at_their_first_occurrence(engine, prompts) -> None:
    free = engine.generate(prompts, GREEDY)
    decode = engine.tokenizer.decode
    text = decode(free[1].token_ids[:6], skip_special_tokens=True)
    stop = text[-2:]  # ends exactly at the 6th token of prompt 1's greedy output
    params = SamplingParams(max_new_tokens=12, temperature=0.0, stop_strings=(stop,))
    for gen, full in zip(engine.generate(prompts, params), free, strict=True):
        # the shortest prefix of the free-running output whose text contains the stop string
        cut = next(
            (
                n
                for n in range(1, 13)
                if stop in decode(full.token_ids[:n], skip_special_tokens=True)
            ),
            None,
        )
        if cut is None:
            assert gen.token_ids == full.token_ids and gen.finish_reason == "length"
        else:
            assert gen.token_ids == full.token_ids[:cut] and gen.finish_reason == "stop"
            assert decode(gen.token_ids, skip_special_tokens=True).endswith(stop)


def test_load_weights_is_followed_by_the_fused_forward(tiny_model_dir, tmp_path, prompts) -> None:
    from agent_core.models import build_tiny_model

    other = make(build_tiny_model(tmp_path / "other", seed=1))
    engine = make(tiny_model_dir, dtype="bfloat16")
    engine.load_weights(other.model.state_dict(), policy_version=3)
    assert engine.policy_version == 3
    again = make(tmp_path / "other", dtype="bfloat16")
    assert [g.token_ids for g in engine.generate(prompts, GREEDY)] == [
        g.token_ids for g in again.generate(prompts, GREEDY)
    ]


def test_threads_apply_only_while_generating(tiny_model_dir, prompts) -> None:
    before = torch.get_num_threads()
    engine = HFRolloutEngine(tiny_model_dir, threads=1)
    seen: list[int] = []
    step = engine.backend.step
    engine.backend.step = lambda tokens: seen.append(torch.get_num_threads()) or step(tokens)
    engine.generate(prompts[:1], SamplingParams(max_new_tokens=3))
    assert set(seen) == {1} and torch.get_num_threads() == before


@pytest.mark.parametrize("vocab", [256, 700])
def test_sampler_draws_from_the_tempered_distribution(vocab, monkeypatch) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(vocab, generator=gen) * 2
    logits[::7] = float("-inf")  # zero-probability tokens are never drawn
    rows = logits.expand(20000, vocab)
    monkeypatch.setattr(sampler, "_SAMPLE_ROWS", 20000)  # one chunk: fast in a test
    tokens, logps = sampler.sample_tokens(rows, 0.8, 1.0, gen)
    probs = torch.softmax(logits / 0.8, -1)
    freq = torch.bincount(tokens, minlength=vocab).float() / len(tokens)
    assert (freq - probs).abs().max() < 0.01 and not bool(freq[::7].any())
    assert torch.allclose(logps, torch.log(probs[tokens]), atol=1e-5)


def test_nucleus_sampler_keeps_the_smallest_prefix_reaching_top_p(monkeypatch) -> None:
    gen = torch.Generator().manual_seed(1)
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    rows = probs.log().expand(20000, 5)
    monkeypatch.setattr(sampler, "_SAMPLE_ROWS", 20000)
    tokens, logps = sampler.sample_tokens(rows, 1.0, 0.8, gen)
    # mass before token 2 is 0.7 <= 0.8: kept; before token 3 it is 0.85 > 0.8: dropped
    freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
    expected = torch.tensor([0.5, 0.2, 0.15, 0.0, 0.0]) / 0.85
    assert (freq - expected).abs().max() < 0.015
    assert torch.allclose(logps, probs.log()[tokens], atol=1e-5)  # full distribution's log-probs


def test_fused_forward_reproduces_qwen2_with_qkv_biases(tmp_path, prompts) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agent_core.models import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # biases far from zero, so a dropped bias would show
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.5)
    model.save_pretrained(tmp_path / "qwen2")
    tokenizer.save_pretrained(tmp_path / "qwen2")
    fused, reference = make(tmp_path / "qwen2"), make(tmp_path / "qwen2", fused=False)
    assert isinstance(fused.backend, FusedLlamaBackend)
    for g, r in zip(
        fused.generate(prompts, GREEDY), reference.generate(prompts, GREEDY), strict=True
    ):
        assert g.token_ids == r.token_ids and g.logprobs == pytest.approx(r.logprobs, abs=1e-5)
