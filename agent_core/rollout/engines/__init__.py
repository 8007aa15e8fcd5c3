"""Rollout engines, one module per kind: transformers in-process (hf), any OpenAI-compatible server
in token ids (remote), and the vLLM server steprl starts (vllm_server).
"""
