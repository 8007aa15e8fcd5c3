"""Settings of the server-backed rollout engines: `rollout.remote` (any OpenAI-compatible server
steprl talks to in token ids) and `rollout.vllm` (a vLLM server steprl starts and stops)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from configs.base import Section


class RemoteEngineSection(Section):
    """An OpenAI-compatible server (vLLM, SGLang, `steprl serve-policy`) used as the rollout
    engine through /v1/completions with prompt token ids (rollout.engine=remote)."""

    base_url: str = Field(
        "",
        description="The server's root URL, e.g. http://127.0.0.1:8000 (without /v1). "
        "Required for rollout.engine=remote.",
    )
    model: str = Field(
        "policy", description="Model name sent with each request (the server's served name)."
    )
    api_key_env: str = Field(
        "",
        description="Environment variable holding the bearer token sent with every request "
        "(also the token of steprl's reload endpoint); '' = no Authorization header.",
    )
    timeout_s: float = Field(
        600.0,
        gt=0.0,
        description="Seconds one HTTP request may take (a whole batch of responses) before the "
        "rollout fails with the server's URL in the error.",
    )
    max_concurrency: int = Field(
        8, ge=1, description="Requests in flight at once during one generate call."
    )
    prompts_per_request: int = Field(
        64,
        ge=1,
        description="Prompts sent in one /v1/completions request (the prompt field is a list "
        "of token-id lists); a generate call is split into requests of this many.",
    )
    send_seed: bool = Field(
        True,
        description="Send the sampling seed with each request. steprl's server samples one "
        "request's prompts in one seeded engine call (reproducible). vLLM seeds every prompt "
        "of a request alike, so the identical prompts of a group would get identical "
        "samples: rollout.engine=vllm never sends it (the server's --seed applies).",
    )
    weight_sync: Literal["steprl", "vllm", "none"] = Field(
        "steprl",
        description="How the server is told to load each new checkpoint folder: 'steprl' = "
        "POST /steprl/reload of `steprl serve-policy` (started with --reload-token-env); "
        "'vllm' = /collective_rpc reload_weights then /reset_prefix_cache (server started "
        "with VLLM_SERVER_DEV_MODE=1); 'none' = the server cannot reload: fine for "
        "evaluation, a training run fails at its first weight sync.",
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        url = url.rstrip("/")
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http(s) URL: give e.g. http://127.0.0.1:8000")
        if url.endswith("/v1"):
            raise ValueError(f"{url!r} ends in /v1: give the server's root, e.g. {url[:-3]}")
        return url


class VLLMEngineSection(Section):
    """A vLLM OpenAI server that steprl starts (from its own Python environment, see
    `make vllm-env`) on the run's policy folder and stops at run end (rollout.engine=vllm)."""

    python: str = Field(
        ".vllm-venv/bin/python",
        description="Python of the environment vLLM is installed in (vLLM's pins clash with "
        "Prefect's, so it cannot share steprl's environment; `make vllm-env` creates this).",
    )
    host: str = Field("127.0.0.1", description="Address the server binds to.")
    port: int = Field(
        0, ge=0, le=65535, description="TCP port of the server; 0 = a free port picked at start."
    )
    startup_timeout_s: float = Field(
        900.0,
        gt=0.0,
        description="Seconds to wait for the server to answer /health (loading a model on a "
        "busy 2-core CPU takes minutes) before the run fails with the server's log tail.",
    )
    timeout_s: float = Field(
        600.0, gt=0.0, description="Seconds one HTTP request (a batch of responses) may take."
    )
    max_concurrency: int = Field(
        8, ge=1, description="Requests in flight at once during one generate call."
    )
    prompts_per_request: int = Field(
        64, ge=1, description="Prompts sent in one /v1/completions request."
    )
    max_model_len: int = Field(
        4096, ge=16, description="vLLM --max-model-len: longest prompt + response in tokens."
    )
    kv_cache_gb: int = Field(
        2,
        ge=1,
        description="CPU builds: VLLM_CPU_KVCACHE_SPACE, the GiB of KV cache vLLM allocates "
        "(ignored on GPUs, where gpu_memory_utilization in extra_args applies).",
    )
    untie_embeddings: bool = Field(
        True,
        description="Serve each policy from a copy whose tied lm_head is a tensor of its own. "
        "Needed on CPU: vLLM's CPU build packs the lm_head once and an in-place reload of a "
        "tied checkpoint leaves that copy stale (log-probs off by tens of nats). Costs one "
        "write of the weights per reload; false on GPUs saves it.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="More `vllm serve` arguments, e.g. ['--gpu-memory-utilization', '0.5'].",
    )
