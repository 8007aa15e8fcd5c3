"""One training run over its folder: opening and closing it (prepare, lock), the phases of an
iteration (score, write_replay, update; collection is agent_core.collect), the trainer it holds,
where collect and sync run (placement), warm-up, held-out evaluation, what an iteration reports,
and serving a run's checkpoint.
"""
