"""What the policy sees: chat messages rendered into prompt token ids (`PromptRenderer`) and the
context policies that pick which history enters the next observation.
"""
