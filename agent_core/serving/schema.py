"""Request and response models of the OpenAI-compatible API (the subset steprl serves), with
steprl's extensions: prompt and completion token ids, per-token log-probs, policy version."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    """Fields every generation request shares; unknown OpenAI fields are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field("policy", description="Served model name (any name is accepted).")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_tokens: int | None = Field(None, ge=1, description="Most tokens to sample.")
    stop: str | list[str] | None = Field(None, description="Stop strings (cut from the text).")
    n: int = Field(1, ge=1, le=16, description="Responses per prompt.")
    seed: int | None = Field(None, ge=0, description="Sampling seed (see RequestBatcher).")
    stream: bool = Field(
        False, description="The reply comes as server-sent chunks, as its tokens are sampled."
    )
    stream_options: dict[str, Any] | None = Field(
        None, description="With stream: {'include_usage': true} adds a last chunk with usage."
    )

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions."""

    messages: list[dict[str, Any]] = Field(..., min_length=1, description="OpenAI messages.")
    tools: list[dict[str, Any]] | None = Field(None, description="OpenAI function tools.")
    tool_choice: str | dict[str, Any] | None = Field(
        None, description="'none' hides the tools; anything else shows them (not enforced)."
    )
    max_completion_tokens: int | None = Field(None, ge=1, description="Alias of max_tokens.")
    logprobs: bool = Field(False, description="Return per-token log-probs.")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="Alternatives per token.")


class CompletionRequest(_Request):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="Text(s), token ids, or several prompts' token ids."
    )
    logprobs: int | None = Field(None, ge=0, le=20, description="Alternatives per token.")
    echo: bool = Field(False, description="Echo is not supported; must be false.")


class ReloadRequest(BaseModel):
    """POST /steprl/reload: load an HF checkpoint folder's weights into the served engine."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(..., description="The checkpoint folder, as this server's machine sees it.")
    policy_version: int = Field(..., ge=0, description="Policy version the weights are.")


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[dict[str, Any]] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class ChatChoice(BaseModel):
    """One chat response; `token_ids` and `token_logprobs` are exactly what the engine
    sampled (the message may omit a stop string; the ids never do)."""

    index: int
    message: dict[str, Any]
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChatLogprobs | None = None
    token_ids: list[int]
    token_logprobs: list[float]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] = Field(description="The prompt ids the engine was given.")
    policy_version: int
    steprl: dict[str, Any] = Field(default_factory=dict, description="How the prompt was built.")


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]
    stop_reason: str | None = Field(
        None, description="The stop string that ended it (vLLM's field); None at EOS or length."
    )
    logprobs: CompletionLogprobs | None = None
    prompt_token_ids: list[int]
    token_ids: list[int]
    token_logprobs: list[float]


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    policy_version: int
