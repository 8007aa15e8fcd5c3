"""Rollout engines, one module per kind: transformers in-process (hf, with its parts: sampler,
prefill, and the backends hf_cache and fused_llama), any OpenAI-compatible server in token ids
(remote), and the vLLM server steprl starts (vllm_server).
"""
