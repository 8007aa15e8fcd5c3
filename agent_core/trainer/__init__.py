"""The policy update: a DeepSpeed engine around the HF model, batching of step rows, checkpoints."""
