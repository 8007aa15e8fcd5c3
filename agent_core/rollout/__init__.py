"""Rollouts: engines that sample from the policy and the loop that runs episodes against them."""
