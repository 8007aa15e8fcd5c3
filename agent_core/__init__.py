"""steprl's library: one package (room) per role on floors, each importing only lower floors
(see the README's "Where things live" and pyproject's import-linter contracts).
"""
