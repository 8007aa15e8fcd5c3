"""`PromptRenderer`: the one place that turns an observation's chat messages into prompt token ids.

It applies the tokenizer's chat template, shows tool schemas (natively when the template takes
`tools`, else as a Hermes-style block in the system message), and, when an observation only
appends to the previous one, extends the previous prompt token-wise so the sampled response ids
are kept exactly as generated (no re-tokenization drift).
"""

from __future__ import annotations

import json
from typing import Any

from agent_core.core.records import Message, Observation
from agent_core.text.tool_calls import CLOSE_TAG, OPEN_TAG


def compact_tools_block(tools: list[dict[str, Any]]) -> str:
    """One line per tool, `name(arg: type, ...): description`, plus the call syntax. Small models
    follow this far better than a JSON-schema dump."""
    lines = []
    for tool in tools:
        fn = tool["function"]
        props = fn.get("parameters", {}).get("properties", {})
        args = ", ".join(f"{name}: {spec.get('type', 'any')}" for name, spec in props.items())
        lines.append(f"- {fn['name']}({args}): {fn.get('description', '')}")
    return (
        "\n\nTools:\n" + "\n".join(lines) + "\n"
        f'Call a tool with {OPEN_TAG}{{"name": "<tool>", "arguments": {{...}}}}{CLOSE_TAG}'
    )


TOOL_PROMPTS = {"hermes": None, "compact": compact_tools_block, "none": None}


def hermes_tools_block(tools: list[dict[str, Any]]) -> str:
    """The Hermes/Qwen-style description of the callable tools, for templates without `tools`."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "\n\n# Tools\nYou may call the functions below. Their signatures:\n"
        f"<tools>\n{lines}\n</tools>\n"
        f'To call one, reply with {OPEN_TAG}{{"name": <function-name>, "arguments": '
        f"<args-json-object>}}{CLOSE_TAG} and nothing else; its result comes back to you."
    )


class PromptRenderer:
    """Prompt construction over a HF tokenizer's chat template."""

    def __init__(self, tokenizer: Any, tool_prompt: str = "hermes") -> None:
        if tool_prompt not in TOOL_PROMPTS:
            raise ValueError(f"tool_prompt={tool_prompt!r}: choose one of {sorted(TOOL_PROMPTS)}")
        self.tokenizer = tokenizer
        self.tool_prompt = tool_prompt
        template = tokenizer.chat_template or ""
        self.native_tools = tool_prompt == "hermes" and "tools" in template
        self.eos_text = tokenizer.eos_token or ""
        self.eos_ids = {tokenizer.eos_token_id}

    def render(self, obs: Observation) -> str:
        """The prompt text for `obs`, ending with the assistant generation prompt."""
        messages = self._with_tools(obs.messages, obs.tools)
        kwargs: dict[str, Any] = {"tools": obs.tools} if self.native_tools and obs.tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kwargs
        )

    def _with_tools(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[Message]:
        if self.native_tools or not tools or self.tool_prompt == "none":
            return messages
        block = (
            compact_tools_block(tools)
            if self.tool_prompt == "compact"
            else hermes_tools_block(tools)
        )
        if messages and messages[0]["role"] == "system":
            head = {"role": "system", "content": messages[0]["content"] + block}
            return [head, *messages[1:]]
        return [{"role": "system", "content": block.strip()}, *messages]

    def encode(self, obs: Observation) -> list[int]:
        """Prompt ids for `obs`, rendered from scratch."""
        return self.tokenizer.encode(self.render(obs), add_special_tokens=False)

    def extend(
        self,
        prev_obs: Observation,
        prev_prompt_ids: list[int],
        response_ids: list[int],
        obs: Observation,
    ) -> list[int]:
        """Prompt ids for `obs` = previous prompt + response ids (as sampled) + new suffix.

        Falls back to `encode` when `obs` does not append to `prev_obs` or the template
        rewrites earlier text (then the stored prompt is still exactly what the model sees).
        """
        if not obs.appended:
            return self.encode(obs)
        prev_text, next_text = self.render(prev_obs), self.render(obs)
        reply = (
            obs.messages[len(prev_obs.messages)]
            if len(obs.messages) > len(prev_obs.messages)
            else None
        )
        if reply is None or reply["role"] != "assistant" or not next_text.startswith(prev_text):
            return self.encode(obs)
        rest = next_text[len(prev_text) :]
        if not rest.startswith(reply["content"]):
            return self.encode(obs)
        suffix = rest[len(reply["content"]) :]
        if response_ids and response_ids[-1] in self.eos_ids and suffix.startswith(self.eos_text):
            suffix = suffix[len(self.eos_text) :]  # the sampled EOS already closes the turn
        return [
            *prev_prompt_ids,
            *response_ids,
            *self.tokenizer.encode(suffix, add_special_tokens=False),
        ]
