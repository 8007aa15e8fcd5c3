"""`steprl` imports the user's own modules from the directory it runs in, as `python -m` does:
a `--set env.name=package.module:Class` the docs show must not fail with 'No module named'."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_steprl_imports_a_module_from_its_working_directory(tmp_path: Path) -> None:
    # not an AgentEnv: the load refuses it, which it can only say after importing the module
    (tmp_path / "my_envs.py").write_text("class NotAnEnv:\n    pass\n")
    script = Path(sys.executable).parent / "steprl"
    done = subprocess.run(
        [str(script), "train", "--config", "smoke", "--set", "env.name=my_envs:NotAnEnv"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "No module named" not in out, out
    assert "my_envs:NotAnEnv" in out and "AgentEnv" in out, out
