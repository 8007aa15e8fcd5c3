"""Rollout collection: which tasks an iteration draws, the episode loop a config asks for, and one
rollout shard run end to end into its staged Arrow file (in the flow's process or on a rollout
worker).
"""
