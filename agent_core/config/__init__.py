"""A run's config loaded and checked before any heavy work: YAML preset or file plus overrides
(load), an env class against what steprl calls it with (env_contract), and what a deployment run
may name on this machine (deployment).
"""
