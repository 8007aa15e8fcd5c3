"""The policy server: steprl's engine behind an OpenAI-compatible HTTP API (chat, responses,
completions, models), with concurrent requests batched into the engine's batched decoding; and
rollouts of a user's own agent function through it, each episode in a process of its own.
"""
