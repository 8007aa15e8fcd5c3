"""PromptRenderer: prompts from chat messages, and token-exact prompt extension (no re-tokenizing)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from agent_core.core.records import Observation
from agent_core.models import CHATML_TEMPLATE
from agent_core.prompting.renderer import PromptRenderer
from agent_core.tools.calculator import CalculatorTool

SCHEMA = [CalculatorTool().schema()]


def _merging_tokenizer() -> PreTrainedTokenizerFast:
    """A BPE with merges, so re-tokenizing decoded text can differ from the sampled ids."""
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
    )
    corpus = ["hello world answer tool call", "abab abab calculator", "system user assistant"] * 20
    core.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|pad|>", unk_token="<unk>"
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def _turns(reply: str) -> tuple[Observation, Observation]:
    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    second = [*first, {"role": "assistant", "content": reply}, {"role": "tool", "content": "5"}]
    return Observation(first, SCHEMA), Observation(second, SCHEMA, appended=True)


def test_tools_block_styles(tiny_tokenizer) -> None:
    obs, _ = _turns("x")
    hermes = PromptRenderer(tiny_tokenizer, "hermes").render(obs)
    assert "<tools>" in hermes and '"name": "calculator"' in hermes
    compact = PromptRenderer(tiny_tokenizer, "compact").render(obs)
    assert "- calculator(expression: string)" in compact and "<tools>" not in compact
    plain = PromptRenderer(tiny_tokenizer, "none").render(obs)
    assert "calculator" not in plain and plain.endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="tool_prompt"):
        PromptRenderer(tiny_tokenizer, "xml")


def test_extend_equals_full_render_when_tokenization_is_canonical(tiny_tokenizer) -> None:
    flow = PromptRenderer(tiny_tokenizer)
    first, second = _turns("<tool_call>{}</tool_call>")
    prompt = flow.encode(first)
    response = tiny_tokenizer.encode(
        "<tool_call>{}</tool_call><|im_end|>", add_special_tokens=False
    )
    extended = flow.extend(first, prompt, response, second)
    assert extended[: len(prompt) + len(response)] == prompt + response
    assert extended == flow.encode(second)  # a byte tokenizer has exactly one tokenization


def test_extend_keeps_sampled_ids_that_retokenize_differently() -> None:
    tok = _merging_tokenizer()
    flow = PromptRenderer(tok, "none")
    first, second = _turns("abab")
    prompt = flow.encode(first)
    # the policy sampled "abab" as single characters; re-encoding the text would merge them
    response = [tok.convert_tokens_to_ids(c) for c in "abab"] + [tok.eos_token_id]
    assert tok.encode("abab", add_special_tokens=False) != response[:-1]
    extended = flow.extend(first, prompt, response, second)
    assert extended[: len(prompt) + len(response)] == prompt + response
    # what follows the reply is the template's text, tokenized as a fresh render would
    full = flow.encode(second)
    merged = [*tok.encode("abab", add_special_tokens=False), tok.eos_token_id]
    assert full[: len(prompt) + len(merged)] == prompt + merged
    assert extended[len(prompt) + len(response) :] == full[len(prompt) + len(merged) :]


def test_extend_closes_a_turn_cut_at_a_stop_string(tiny_tokenizer) -> None:
    flow = PromptRenderer(tiny_tokenizer)
    first, second = _turns("<tool_call>{}</tool_call>")
    prompt = flow.encode(first)
    response = tiny_tokenizer.encode(
        "<tool_call>{}</tool_call>", add_special_tokens=False
    )  # no EOS
    extended = flow.extend(first, prompt, response, second)
    assert tiny_tokenizer.decode(extended) == flow.render(second)


def test_non_appended_observation_is_rendered_fresh(tiny_tokenizer) -> None:
    flow = PromptRenderer(tiny_tokenizer)
    first, second = _turns("x")
    second.appended = False
    assert flow.extend(first, [1, 2, 3], [4], second) == flow.encode(second)
