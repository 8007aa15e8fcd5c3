"""A run's config loaded and checked before any heavy work: presets and their paths (presets), YAML
plus overrides and every name and size check (load), an env class against what steprl calls it
with (env_contract), what a deployment run may name on this machine (deployment), and the config
a checkpoint is served with (recorded).
"""
