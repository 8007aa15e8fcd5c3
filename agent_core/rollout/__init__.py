"""Rollouts: the engine contract, the engines by name (hf, remote, vllm), the loop that runs env
episodes against one engine, and how an iteration's tasks split into shards.
"""
