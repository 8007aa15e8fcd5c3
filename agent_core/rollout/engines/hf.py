"""The transformers rollout engine: one batched KV-cache decoding loop over all prompts.

Each decoding step is one forward over the live sequences (left padding, per-sequence stop on
EOS or stop strings); finished sequences leave the batch and the cache. Llama-family models
(Llama, SmolLM, Qwen2) run a fused forward over a preallocated KV cache that prefills a prefix
shared by the whole batch once; any other causal LM runs through HF's own forward.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from agent_core.rollout.engine import FinishReason, Generation, SamplingParams, StepCallback

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_SAMPLE_ROWS = 8  # rows sampled together (8 x 49k float32 logits fit in L2)
_CDF_BLOCK = 256  # vocabulary block of the two-level inverse-CDF sampler
_TOPK_START = 64  # first candidate count of the nucleus sampler (grows x4 while too small)
_PACK_ROWS = 32  # batch-size hint for the weight reorder (any batch works with the result)
_PREFILL_TOKENS = 4096  # padded prompt tokens per prefill chunk (bounds activation memory)
FUSED_MODEL_TYPES = ("llama", "qwen2")
_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


# ---------------------------------------------------------------- sampling


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` [B, V]; return (tokens [B], log-probs [B] float32).

    Log-probs are of log_softmax(logits / T) over the whole vocabulary; T = 0 means greedy
    (argmax), with log-probs of the untempered distribution. Each row draws one uniform (inverse
    CDF; `torch.multinomial`'s exponential race draws V of them, ~40x slower on CPU), and rows
    go in chunks whose float32 copies stay in L2 cache across the few passes over them.
    """
    rows = logits.shape[0]
    device = logits.device
    uniforms = torch.rand(rows, 1, dtype=torch.float64, device=device, generator=generator)
    tokens = torch.empty(rows, dtype=torch.long, device=device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=device)
    for start in range(0, rows, _SAMPLE_ROWS):
        part = slice(start, start + _SAMPLE_ROWS)
        tokens[part], logprobs[part] = _sample_rows(
            logits[part].float(), temperature, top_p, uniforms[part]
        )
    return tokens, logprobs


def _sample_rows(
    x: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_tokens` on float32 logits `x` [b, V] with one uniform [b, 1] per row."""
    if temperature == 0.0:
        best, tokens = x.max(-1)  # max(dim) is ~3x faster than argmax on CPU
        return tokens, best - torch.logsumexp(x, -1)
    top = x.max(-1, keepdim=True).values
    weights = (x - top).mul_(1.0 / temperature).exp_()  # exp(x / T) up to a per-row factor
    if top_p < 1.0:
        tokens, total = _sample_nucleus(weights, top_p, uniforms)
    else:
        tokens, total = _sample_inverse_cdf(weights, uniforms)
    chosen = (x.gather(-1, tokens[:, None]) - top).squeeze(-1) / temperature
    return tokens, chosen - total.log().float()


def _sample_inverse_cdf(
    weights: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw per row from non-negative `weights` [b, V] given uniforms [b, 1]; also returns
    the row totals [b] (float64). Picks a block of `_CDF_BLOCK` tokens by its mass, then a token
    inside it by a float64 cumulative sum (a float32 cumsum over V would drift by ~1e-5)."""
    rows, vocab = weights.shape
    pad = (-vocab) % _CDF_BLOCK
    padded = F.pad(weights, (0, pad)) if pad else weights
    blocks = padded.view(rows, -1, _CDF_BLOCK)
    sums = blocks.sum(-1).double()  # [b, nb]
    cdf = sums.cumsum(-1)
    u = uniforms * cdf[:, -1:]
    block = torch.minimum(torch.searchsorted(cdf, u, right=True), _last_positive(cdf))
    inner = blocks.gather(1, block[:, :, None].expand(rows, 1, _CDF_BLOCK)).squeeze(1)
    inner = inner.double().cumsum(-1)  # [b, block]
    mass = sums.gather(-1, block)
    u = (u - (cdf.gather(-1, block) - mass)).clamp(min=0.0) / mass * inner[:, -1:]
    offset = torch.minimum(torch.searchsorted(inner, u, right=True), _last_positive(inner))
    return (block * _CDF_BLOCK + offset).squeeze(1), cdf[:, -1]


def _last_positive(cdf: torch.Tensor) -> torch.Tensor:
    """Index [b, 1] of the entry where the non-decreasing `cdf` [b, N] reaches its total: the
    last entry with positive mass, so rounding can never select a zero-probability token."""
    return (cdf < cdf[:, -1:]).sum(-1, keepdim=True)


def _sample_nucleus(
    weights: torch.Tensor, top_p: float, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Nucleus sampling: keep the smallest prefix of the sorted probabilities whose mass reaches
    `top_p` (the first token always stays). A full sort of the vocabulary costs ~150 ms per step
    on CPU, so candidates come from `topk`, grown until they hold every row's nucleus."""
    vocab = weights.shape[-1]
    total = weights.sum(-1, keepdim=True, dtype=torch.float64)
    k = min(_TOPK_START, vocab)
    while True:
        values, order = weights.topk(k, dim=-1)  # sorted, descending
        probs = values.double() / total
        if k == vocab or bool((probs.sum(-1) > top_p).all()):
            break
        k = min(4 * k, vocab)
    outside = probs.cumsum(-1) - probs > top_p
    pick, _ = _sample_inverse_cdf(probs.masked_fill(outside, 0.0), uniforms)
    return order.gather(-1, pick[:, None]).squeeze(-1), total.squeeze(-1)


# ---------------------------------------------------------------- model backends


class _Backend(Protocol):
    """A batch of sequences in a KV cache: prefill, one decoding step, keep some rows."""

    def prefill(self, prompts: list[list[int]], max_new_tokens: int) -> torch.Tensor:
        """Start one cache row per prompt; return next-token logits [N, V]."""
        ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append `tokens` [B] to every row; return next-token logits [B, V]."""
        ...

    def select(self, rows: torch.Tensor) -> None:
        """Keep (or repeat) the cache rows `rows` [B'], in that order."""
        ...

    def weights_changed(self) -> None:
        """The model's parameters were overwritten in place (`load_state_dict`)."""
        ...

    def release(self) -> None:
        """Free the cache between generate calls (the trainer wants the memory)."""
        ...


class HFCacheBackend:
    """Any HF causal LM: its own forward with a DynamicCache over left-padded prompts."""

    def __init__(self, model: torch.nn.Module, pad_id: int, device: torch.device) -> None:
        self.model, self.pad_id, self.device = model, pad_id, device

    def prefill(self, prompts: list[list[int]], max_new_tokens: int) -> torch.Tensor:
        ids, self.mask = _left_pad(prompts, self.pad_id, self.device)
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        self.cache = DynamicCache()
        self.next_pos = positions[:, -1] + 1
        return self._forward(ids, positions)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(tokens), 1))], dim=-1)
        logits = self._forward(tokens[:, None], self.next_pos[:, None])
        self.next_pos = self.next_pos + 1
        return logits

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask, self.next_pos = self.mask[rows], self.next_pos[rows]

    def weights_changed(self) -> None:
        pass  # the model's own forward reads its parameters directly

    def release(self) -> None:
        self.cache = self.mask = self.next_pos = None

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :]


def _left_pad(
    prompts: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask [N, W], each prompt right-aligned (left padding)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def fusable(model: torch.nn.Module) -> bool:
    """Whether `model` is a Llama-family decoder `FusedLlamaBackend` reproduces exactly: RMSNorm,
    rotary attention (optional q/k/v bias, no q/k norm, no sliding window), SiLU gated MLP."""
    config = model.config
    if config.model_type not in FUSED_MODEL_TYPES or getattr(config, "hidden_act", "") != "silu":
        return False
    if getattr(config, "use_sliding_window", False) or getattr(config, "mlp_bias", False):
        return False
    layer = model.model.layers[0]
    attn = layer.self_attn
    return attn.o_proj.bias is None and not hasattr(attn, "q_norm")


def _fuse_linears(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) of `linears` into one matrix and make each layer's
    parameters views into it: one GEMM instead of several, with no second copy of the weights,
    and `load_state_dict` (which copies into parameters in place) keeps updating the fused one."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    has_bias = linears[0].bias is not None
    bias = torch.cat([lin.bias.detach() for lin in linears]) if has_bias else None
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(weight[start : start + rows], requires_grad=False)
        if bias is not None:
            lin.bias = torch.nn.Parameter(bias[start : start + rows], requires_grad=False)
        start += rows
    return weight, bias


class PackedLinear:
    """x @ W.T + b with W reordered once into oneDNN's blocked layout (bf16 and fp32).

    On CPU a plain `F.linear` re-packs W on every call; for decoding (few rows, weights streamed
    from memory) that doubles the matmul time. (MKL's fp32 packed GEMM is not used: it falls back
    to a plain GEMM whenever the row count differs from the packing hint, i.e. once rows
    finish.) Call `repack` after W changes. Elsewhere (GPU, builds without oneDNN) it is
    `F.linear`.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias
        self.repack()

    def repack(self) -> None:
        self.packed = None
        if self.weight.device.type == "cpu" and self.weight.dtype in _DTYPES.values():
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, _PACK_ROWS)
            except (AttributeError, RuntimeError):  # an op missing from this torch build
                self.packed = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class _Layer:
    """The tensors of one decoder layer, with q/k/v and gate/up fused."""

    def __init__(self, layer: torch.nn.Module, pack: bool) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        linear = PackedLinear if pack else _PlainLinear
        self.ln1 = layer.input_layernorm.weight
        self.ln2 = layer.post_attention_layernorm.weight
        self.qkv = linear(*_fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj]))
        self.o = linear(attn.o_proj.weight)
        self.gate_up = linear(*_fuse_linears([mlp.gate_proj, mlp.up_proj]))
        self.down = linear(mlp.down_proj.weight)

    def linears(self) -> list[PackedLinear]:
        return [self.qkv, self.o, self.gate_up, self.down]


class _PlainLinear(PackedLinear):
    """`F.linear` always (to measure what packing buys)."""

    def repack(self) -> None:
        self.packed = None


class FusedLlamaBackend:
    """A Llama-family forward written for batched sampling: fused and pre-packed GEMMs, RoPE on
    q and k at once, grouped-query attention without repeating keys, logits of the last
    position only, and a preallocated KV cache [layers, 2, B, kv_heads, slots, head_dim].

    With `share_prefix`, the prompt prefix common to the whole batch (a chat template's system
    prompt and few-shot examples) is prefilled once into its own cache, and every attention
    attends to it once for all rows (cascade attention: two flash-attention passes merged by
    their log-sum-exp), so neither its compute nor its memory traffic scales with the batch.
    """

    def __init__(
        self, model: torch.nn.Module, share_prefix: bool = True, pack: bool = True
    ) -> None:
        config = model.config
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.groups = self.heads // self.kv_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.hidden, self.eps = config.hidden_size, config.rms_norm_eps
        self.inter = config.intermediate_size
        self.layers = [_Layer(layer, pack) for layer in model.model.layers]
        self.lm_head = (PackedLinear if pack else _PlainLinear)(model.lm_head.weight)
        self.device = model.lm_head.weight.device
        self.share_prefix = share_prefix and _cascade_supported(self.device)
        self.prefix: torch.Tensor | None = None  # [layers, 2, 1, kv_heads, shared, head_dim]
        self.prefill_forwards = 0  # prefill forwards run (prefix + chunks), for tests

    def weights_changed(self) -> None:
        for linear in [self.lm_head, *(lin for layer in self.layers for lin in layer.linears())]:
            linear.repack()

    def prefill(self, prompts: list[list[int]], max_new_tokens: int) -> torch.Tensor:
        shared = _common_prefix(prompts) if self.share_prefix and len(prompts) > 1 else 0
        width = max(len(p) for p in prompts) - shared  # slots of the longest own suffix
        self.kv = self._empty_cache(len(prompts), width + max_new_tokens)
        self.valid = torch.zeros((len(prompts), width + max_new_tokens), dtype=torch.bool)
        self.valid = self.valid.to(self.device)
        self.length = width
        self.next_pos = torch.tensor([len(p) for p in prompts], device=self.device)
        self.prefix = self._prefill_prefix(prompts[0][:shared]) if shared else None
        weight = self.lm_head.weight
        logits = weight.new_empty((len(prompts), weight.shape[0]))
        for rows in _chunks(prompts, shared):
            logits[rows] = self._prefill_rows([prompts[r] for r in rows], rows, shared, width)
        return logits

    def _empty_cache(self, rows: int, slots: int) -> torch.Tensor:
        shape = (len(self.layers), 2, rows, self.kv_heads, slots, self.head_dim)
        return torch.empty(shape, dtype=self.lm_head.weight.dtype, device=self.device)

    def _prefill_prefix(self, prefix: list[int]) -> torch.Tensor:
        """The shared prefix, once, into its own cache."""
        n = len(prefix)
        cache = self._empty_cache(1, n)
        ids = torch.tensor([prefix], device=self.device)
        causal = torch.ones((1, n, n), dtype=torch.bool, device=self.device).tril()
        positions = torch.arange(n, device=self.device)[None]
        self._forward(ids, positions, cache, 0, self._mask(causal), None)
        self.prefill_forwards += 1
        return cache

    def _prefill_rows(
        self, prompts: list[list[int]], rows: list[int], shared: int, width: int
    ) -> torch.Tensor:
        """Own suffixes of `prompts` (cache rows `rows`, contiguous), left-padded to the chunk's
        width and placed so that every row's last prompt token sits in slot `width - 1`."""
        n = max(len(p) for p in prompts) - shared
        start = width - n
        ids = torch.zeros((len(rows), n), dtype=torch.long)
        positions = torch.zeros((len(rows), n), dtype=torch.long)
        cache_rows = slice(rows[0], rows[-1] + 1)
        self.kv[:, :, cache_rows, :, :start] = 0  # never-written pad slots: masked, not garbage
        for i, prompt in enumerate(prompts):
            suffix = prompt[shared:]
            ids[i, n - len(suffix) :] = torch.tensor(suffix)
            positions[i, n - len(suffix) :] = torch.arange(shared, len(prompt))
            self.valid[rows[0] + i, width - len(suffix) : width] = True
        keys = torch.arange(width, device=self.device)
        queries = torch.arange(start, width, device=self.device)
        # a query sees valid earlier keys; a pad query also sees itself (no all-masked row)
        allowed = self.valid[cache_rows, None, :width] & (keys <= queries[:, None])
        allowed |= keys == queries[:, None]
        ids, positions = ids.to(self.device), positions.to(self.device)
        cache = self.kv[:, :, cache_rows]
        self.prefill_forwards += 1
        return self._forward(ids, positions, cache, start, self._mask(allowed), self.prefix)

    def release(self) -> None:
        self.kv = self.valid = self.next_pos = self.prefix = None

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        slot = self.length
        self.valid[:, slot] = True
        mask = self._mask(self.valid[:, None, : slot + 1])
        positions = self.next_pos[:, None]
        logits = self._forward(tokens[:, None], positions, self.kv, slot, mask, self.prefix)
        self.length += 1
        self.next_pos = self.next_pos + 1
        return logits

    def select(self, rows: torch.Tensor) -> None:
        used = self.length
        if len(rows) < self.kv.shape[2] and bool((rows[1:] > rows[:-1]).all()):
            # dropping finished rows: compact in place (a source row never precedes its target)
            for target, source in enumerate(rows.tolist()):
                if target != source:
                    self.kv[:, :, target, :, :used] = self.kv[:, :, source, :, :used]
            self.kv = self.kv[:, :, : len(rows)]
        else:
            self.kv = self.kv[:, :, rows]
        self.valid, self.next_pos = self.valid[rows], self.next_pos[rows]

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """Additive mask [b, 1, groups * S, keys] (or [b, 1, 1, keys] when S = 1) from a bool
        [b, S, keys]: queries are laid out group-major, see `_attend`."""
        b, s, keys = allowed.shape
        if s > 1:
            allowed = allowed[:, None].expand(b, self.groups, s, keys).reshape(b, -1, keys)
        additive = torch.zeros(allowed.shape, dtype=self.lm_head.weight.dtype, device=self.device)
        return additive.masked_fill_(~allowed, float("-inf"))[:, None]

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: torch.Tensor,
        start: int,
        mask: torch.Tensor,
        prefix: torch.Tensor | None,
    ) -> torch.Tensor:
        """Logits [b, V] of the last position of `ids` [b, S], writing their keys and
        values into slots [start, start + S) of `cache` [layers, 2, b, kv_heads, slots, dim]."""
        hidden = F.embedding(ids, self.model.model.embed_tokens.weight)
        cos, sin = self.model.model.rotary_emb(hidden, positions)
        rope = (cos[:, :, None], sin[:, :, None])  # broadcast over heads
        for i, layer in enumerate(self.layers):
            shared = None if prefix is None else prefix[i]
            hidden = self._layer(layer, hidden, rope, cache[i], start, mask, shared)
        last = F.rms_norm(hidden[:, -1], (self.hidden,), self.model.model.norm.weight, self.eps)
        return self.lm_head(last)

    def _layer(self, layer: _Layer, hidden, rope, cache, start: int, mask, prefix):
        b, s, _ = hidden.shape
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        x = F.rms_norm(hidden, (self.hidden,), layer.ln1, self.eps)
        qkv = layer.qkv(x).view(b, s, heads + 2 * kv_heads, dim)
        qk = _rotate(qkv[:, :, : heads + kv_heads], *rope)
        end = start + s
        cache[0, :, :, start:end] = qk[:, :, heads:].transpose(1, 2)
        cache[1, :, :, start:end] = qkv[:, :, heads + kv_heads :].transpose(1, 2)
        # query heads kv * groups + g share kv head `kv`: lay them out [b, kv, g * S, dim]
        query = qk[:, :, :heads].reshape(b, s, kv_heads, self.groups, dim)
        query = query.permute(0, 2, 3, 1, 4).reshape(b, kv_heads, -1, dim)
        out = _attend(query, cache[0, :, :, :end], cache[1, :, :, :end], mask, prefix)
        out = out.view(b, kv_heads, self.groups, s, dim).permute(0, 3, 1, 2, 4)
        hidden = hidden + layer.o(out.reshape(b, s, heads * dim))
        x = F.rms_norm(hidden, (self.hidden,), layer.ln2, self.eps)
        gate, up = layer.gate_up(x).split(self.inter, dim=-1)
        return hidden + layer.down(F.silu(gate) * up)


def _attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    prefix: torch.Tensor | None,
) -> torch.Tensor:
    """Attention of `query` [b, kv, Q, dim] over each row's `keys`/`values` [b, kv, T, dim]
    (additive `mask` [b, 1, Q|1, T]) and, when given, a `prefix` cache [2, 1, kv, P, dim] that
    all rows share and see whole: its pass runs once over all b * Q queries, and the two
    partial softmaxes merge exactly through their log-sum-exps."""
    if prefix is None:
        return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask)
    b, kv, q, dim = query.shape
    own, own_lse = _FLASH(query, keys, values, attn_mask=mask)[:2]
    flat = query.transpose(0, 1).reshape(1, kv, b * q, dim)
    shared, shared_lse = _FLASH(flat, prefix[0], prefix[1])[:2]
    shared = shared.view(kv, b, q, dim).transpose(0, 1)
    shared_lse = shared_lse.view(kv, b, q).transpose(0, 1)
    # softmax weight of the own part: e^own_lse / (e^own_lse + e^shared_lse)
    weight = torch.sigmoid(own_lse - shared_lse)[..., None]
    return torch.lerp(shared.float(), own.float(), weight).to(query.dtype)


def _cascade_supported(device: torch.device) -> bool:
    """Whether this torch build has the CPU flash-attention op that returns log-sum-exps."""
    if device.type != "cpu" or _FLASH is None:
        return False
    try:
        x = torch.zeros((1, 1, 2, 8))
        _FLASH(x, x, x, attn_mask=torch.zeros((1, 1, 2, 2)))
    except RuntimeError:
        return False
    return True


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of `x` [b, S, heads, D] (HF's rotate_half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _common_prefix(prompts: list[list[int]]) -> int:
    """Length of the longest common prefix, leaving every prompt at least one own token."""
    shortest = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < shortest and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def _chunks(prompts: list[list[int]], shared: int) -> Iterator[list[int]]:
    """Consecutive row ranges whose padded suffixes fit `_PREFILL_TOKENS` (rows come sorted by
    length, see `_plan`, so a chunk pads little)."""
    rows: list[int] = []
    width = 0
    for row, prompt in enumerate(prompts):
        need = max(width, len(prompt) - shared)
        if rows and need * (len(rows) + 1) > _PREFILL_TOKENS:
            yield rows
            rows, need = [], len(prompt) - shared
        rows.append(row)
        width = need
    yield rows


# ---------------------------------------------------------------- the engine


class HFRolloutEngine:
    """Batched sampling from a local HF causal LM folder on CPU or GPU.

    `threads` (0 = torch's default) is the intra-op thread count used while generating (restored
    afterwards, so a trainer in the same process keeps its own). `fused` picks the fused
    Llama-family forward when the model allows it; `share_prefix` lets it prefill the batch's
    common prompt prefix once.
    """

    def __init__(
        self,
        model_path: str | Path,
        dtype: str = "float32",
        device: str = "cpu",
        threads: int = 0,
        *,
        fused: bool = True,
        share_prefix: bool = True,
        pack_weights: bool = True,
    ) -> None:
        self.threads = threads
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=False)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=_DTYPES[dtype], trust_remote_code=False
        )
        self.model.to(device).eval()
        self.device = torch.device(device)
        self.pad_id = self._pad_id()
        self.eos_ids = self._eos_ids()
        self.policy_version = 0
        self._lock = threading.Lock()
        self._stop_tables: dict[tuple[str, ...], torch.Tensor] = {}
        self.backend: _Backend
        if fused and fusable(self.model):
            self.backend = FusedLlamaBackend(self.model, share_prefix, pack_weights)
        else:
            self.backend = HFCacheBackend(self.model, self.pad_id, self.device)

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
            self.backend.weights_changed()
            self.policy_version = policy_version

    @torch.inference_mode()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, on_step: StepCallback | None = None
    ) -> list[Generation]:
        """Sample one response per prompt with one forward per decoding step over all of them;
        `on_step` sees each step's new tokens as they are sampled (streaming servers)."""
        if not prompts:
            return []
        with self._lock, self._threads():
            return self._generate(prompts, params, on_step)

    @contextlib.contextmanager
    def _threads(self) -> Iterator[None]:
        before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def _generate(
        self, prompts: list[list[int]], params: SamplingParams, on_step: StepCallback | None
    ) -> list[Generation]:
        generator = torch.Generator(device=self.device).manual_seed(params.seed)
        unique, rows = _plan(prompts)
        try:
            logits = self.backend.prefill(unique, params.max_new_tokens)
            if len(unique) < len(prompts) or rows != list(range(len(prompts))):
                # identical prompts (a GRPO group) share one prefill; rows in the caller's order
                index = torch.tensor(rows, device=self.device)
                self.backend.select(index)
                logits = logits[index]
            return self._decode(logits, len(prompts), params, generator, on_step)
        finally:
            self.backend.release()

    def _decode(
        self, logits: torch.Tensor, n: int, params: SamplingParams, generator: torch.Generator,
        on_step: StepCallback | None = None,
    ) -> list[Generation]:  # fmt: skip
        out_tokens = torch.zeros((n, params.max_new_tokens), dtype=torch.long)
        out_logps = torch.zeros((n, params.max_new_tokens), dtype=torch.float32)
        lengths = [params.max_new_tokens] * n
        reasons: list[FinishReason] = ["length"] * n
        live = torch.arange(n)  # original index of each live batch row
        for step in range(params.max_new_tokens):
            new, new_lp = sample_tokens(logits, params.temperature, params.top_p, generator)
            out_tokens[live, step], out_logps[live, step] = new.cpu(), new_lp.cpu()
            if on_step is not None:
                on_step(live.tolist(), new.tolist(), new_lp.tolist())
            done = self._finished(out_tokens, live, step, params.stop_strings, reasons)
            for row in done:
                lengths[int(live[row])] = step + 1
            if step == params.max_new_tokens - 1 or len(done) == len(live):
                break
            if done:
                keep = torch.ones(len(live), dtype=torch.bool)
                keep[done] = False
                live, new = live[keep], new[keep.to(new.device)]
                self.backend.select(keep.nonzero().squeeze(1).to(self.device))
            logits = self.backend.step(new)
        tokens, logps = out_tokens.tolist(), out_logps.tolist()
        return [
            Generation(tokens[i][: lengths[i]], logps[i][: lengths[i]], reasons[i])
            for i in range(n)
        ]

    def _finished(
        self,
        out_tokens: torch.Tensor,
        live: torch.Tensor,
        step: int,
        stop_strings: tuple[str, ...],
        reasons: list[FinishReason],
    ) -> list[int]:
        """Batch rows that end at this step (recording why): EOS, or a stop string completed by
        the new token. Only rows whose new token could complete a stop string decode text."""
        new = out_tokens[live, step]
        eos = torch.isin(new, torch.tensor(sorted(self.eos_ids), dtype=torch.long))
        check = self._stop_table(stop_strings)[new] & ~eos if stop_strings else None
        done = []
        for row in (eos if check is None else eos | check).nonzero().squeeze(1).tolist():
            seq = int(live[row])
            if eos[row]:
                reasons[seq] = "eos"
            elif self._has_stop(out_tokens[seq, : step + 1].tolist(), stop_strings):
                reasons[seq] = "stop"
            else:
                continue
            done.append(row)
        return done

    def _has_stop(self, seq: list[int], stop_strings: tuple[str, ...]) -> bool:
        # decode only a short tail: a stop string ends within the last few tokens
        tail_len = max(len(s) for s in stop_strings) + 2
        tail = self.tokenizer.decode(seq[-tail_len:], skip_special_tokens=True)
        return any(s in tail for s in stop_strings)

    def _stop_table(self, stop_strings: tuple[str, ...]) -> torch.Tensor:
        """Bool [V]: whether a token could complete one of `stop_strings`, i.e. its text holds a
        stop string's last character, or is empty / a partial UTF-8 byte (conservative)."""
        table = self._stop_tables.get(stop_strings)
        if table is None:
            vocab = max(self.model.config.vocab_size, len(self.tokenizer))
            table = torch.ones(vocab, dtype=torch.bool)
            last = {s[-1] for s in stop_strings if s}
            # whitespace can come from a token's leading-space marker: check every token then
            if all(stop_strings) and not any(ch.isspace() for ch in last):
                n = len(self.tokenizer)
                texts = self.tokenizer.batch_decode(
                    [[i] for i in range(n)], skip_special_tokens=True
                )
                table[:n] = torch.tensor(
                    [not t or "\ufffd" in t or any(ch in t for ch in last) for t in texts]
                )
            self._stop_tables[stop_strings] = table
        return table


def _plan(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Unique prompts sorted by length (prefill chunks then pad little) and, for every input
    prompt, its row among them."""
    order = sorted({tuple(p) for p in prompts}, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(order)}
    return [list(p) for p in order], [index[tuple(p)] for p in prompts]
