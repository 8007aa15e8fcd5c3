"""The vocabulary and plumbing every room uses, importing no other room: the step-level MDP
records, name resolution for pluggable parts, progress hooks, fault injection for crash tests.
"""
