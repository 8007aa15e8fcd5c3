"""The policy update: a DeepSpeed engine around the HF model (RL update and SFT), batching of step
rows, checkpoints, process groups, LoRA.
"""
