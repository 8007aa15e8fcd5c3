"""The transformers rollout engine: one batched KV-cache decoding loop over all prompts.

Each decoding step is one forward over the live sequences (left padding, per-sequence stop on
EOS or stop strings); finished sequences leave the batch and the cache.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from agent_core.rollout.engine import FinishReason, Generation, SamplingParams

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` [B, V]; return (tokens [B], log-probs [B]).

    Log-probs are of log_softmax(logits / T) over the whole vocabulary; T = 0 means greedy
    (argmax), with log-probs of the untempered distribution.
    """
    if temperature == 0.0:
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        tokens = logprobs.argmax(-1)
        return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    probs = logprobs.exp()
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        outside = sorted_probs.cumsum(-1) - sorted_probs > top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


class HFRolloutEngine:
    """Batched sampling from a local HF causal LM folder on CPU or GPU."""

    def __init__(
        self,
        model_path: str | Path,
        dtype: str = "float32",
        device: str = "cpu",
        threads: int = 0,
    ) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=_DTYPES[dtype])
        self.model.to(device).eval()
        self.device = torch.device(device)
        self.pad_id = self._pad_id()
        self.eos_ids = self._eos_ids()
        self.policy_version = 0
        self._lock = threading.Lock()

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.tokenizer.eos_token_id

    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        config_eos = self.model.generation_config.eos_token_id or self.model.config.eos_token_id
        ids.update(config_eos if isinstance(config_eos, list) else [config_eos])
        return {i for i in ids if i is not None}

    def load_weights(self, state_dict: dict, policy_version: int) -> None:
        """Copy trainer weights in (cast to this engine's dtype)."""
        with self._lock:
            self.model.load_state_dict(state_dict, strict=False)
            self.policy_version = policy_version

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one response per prompt with one forward per decoding step over all of them."""
        if not prompts:
            return []
        with self._lock:
            return self._generate(prompts, params)

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _forward(self, ids, mask, positions, cache) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :]

    def _generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        generator = torch.Generator(device=self.device).manual_seed(params.seed)
        ids, mask = self._left_pad(prompts)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self._forward(ids, mask, positions, cache)
        next_pos = positions[:, -1] + 1
        live = list(range(len(prompts)))  # original index of each live batch row
        tokens: list[list[int]] = [[] for _ in prompts]
        logps: list[list[float]] = [[] for _ in prompts]
        reasons: list[FinishReason] = ["length"] * len(prompts)
        for step in range(params.max_new_tokens):
            new, new_lp = sample_tokens(logits, params.temperature, params.top_p, generator)
            keep = []
            for row, (tok, lp) in enumerate(zip(new.tolist(), new_lp.tolist(), strict=True)):
                seq = live[row]
                tokens[seq].append(tok)
                logps[seq].append(lp)
                reason = self._finished(tokens[seq], params.stop_strings)
                if reason is None:
                    keep.append(row)
                else:
                    reasons[seq] = reason
            if not keep or step == params.max_new_tokens - 1:
                break
            if len(keep) < len(live):
                cache.batch_select_indices(torch.tensor(keep, device=self.device))
                mask, next_pos, new = mask[keep], next_pos[keep], new[keep]
                live = [live[r] for r in keep]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=-1)
            logits = self._forward(new[:, None], mask, next_pos[:, None], cache)
            next_pos = next_pos + 1
        return [
            Generation(token_ids=t, logprobs=lp, finish_reason=r)
            for t, lp, r in zip(tokens, logps, reasons, strict=True)
        ]

    def _finished(self, seq: list[int], stop_strings: tuple[str, ...]) -> FinishReason | None:
        if seq[-1] in self.eos_ids:
            return "eos"
        if stop_strings:
            # decode only a short tail: a stop string ends within the last few tokens
            tail_len = max(len(s) for s in stop_strings) + 2
            tail = self.tokenizer.decode(seq[-tail_len:], skip_special_tokens=True)
            if any(s in tail for s in stop_strings):
                return "stop"
        return None
