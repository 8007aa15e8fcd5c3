"""Rewards: the reward terms by name and the scoring pass that gives each step its reward, and the
judge term (a model scoring trajectories by a rubric, its engines and the parsing of its
replies).
"""
