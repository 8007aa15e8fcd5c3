"""One training run over its folder: the phases of an iteration, the trainers it holds, where
collect and sync run (placement), the run lock, warm-up, held-out evaluation and what an
iteration reports.
"""
