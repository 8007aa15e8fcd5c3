"""The golden run: the smoke preset on the tiny model for 2 iterations with fixed seeds, one
torch thread, fp32 and torch's AVX2 kernels (the same bits on every x86 box with AVX2), digested
into the rows of each iteration and the final weights. `digests.json` holds the digest recorded
before the house was rebuilt by role; `tests/integration/test_golden_run.py` runs the golden run
again and requires the same bits.

Record again only for a change meant to alter rows or weights, and say so in its commit:
`python -m tests.golden.golden_run --record`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from safetensors.numpy import load_file

REPO = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).with_name("digests.json")
# what differs between two runs of the same code: the MLflow run id (a fresh uuid) and the
# wall-clock timestamps in each step's info
RANDOM_COLUMNS = ("run_id",)
WALL_CLOCK_INFO_KEYS = ("timing",)
PINNED_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's own kernels: AVX2 even on an AVX-512 box
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # MKL's GEMMs
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's
    "DNNL_MAX_CPU_ISA": "AVX2",
    "PYTHONHASHSEED": "0",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
}
SETTINGS = [
    "run.iterations=2",
    "rollout.threads=1",
    "rollout.dtype=float32",
    "trainer.dtype=float32",
]


def run_golden(root: Path) -> dict:
    """Train the golden run under `root` (`steprl train`, as a user runs it) and digest it."""
    overrides = [
        *SETTINGS,
        f"model.path={root / 'tiny-model'}",
        f"run.output_dir={root / 'runs'}",
        f"tracking.tracking_uri=sqlite:///{root / 'mlflow.db'}",
    ]
    command = [sys.executable, "-m", "flows.cli", "train", "--config", "smoke"]
    for item in overrides:
        command += ["--set", item]
    env = {**os.environ, **PINNED_ENV, "PREFECT_HOME": str(root / "prefect-home")}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"golden run failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return digest(root / "runs" / "smoke")


def _clean_info(text: str) -> str:
    info = json.loads(text)
    for key in WALL_CLOCK_INFO_KEYS:
        info.pop(key, None)
    return json.dumps(info, sort_keys=True)


def digest(run_dir: Path) -> dict:
    """sha256 of every step-row column per iteration (rows in key order) and of every tensor
    of the final checkpoint, so a mismatch names the column or tensor that moved."""
    rows: dict[str, dict[str, str]] = {}
    for part in sorted(run_dir.glob("iter_[0-9]*")):
        table = pq.read_table(sorted(part.glob("*.parquet"))).sort_by(
            [("trajectory_id", "ascending"), ("step_index", "ascending")]
        )
        columns = {}
        for name in table.column_names:
            if name in RANDOM_COLUMNS:
                continue
            values = table.column(name).to_pylist()
            if name == "info":
                values = [_clean_info(v) for v in values]
            columns[name] = hashlib.sha256(repr(values).encode()).hexdigest()
        rows[part.name] = columns
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    tensors = load_file(run_dir / "checkpoints" / latest / "model.safetensors")
    weights = {
        name: hashlib.sha256(tensors[name].tobytes()).hexdigest() for name in sorted(tensors)
    }
    return {"checkpoint": latest, "rows": rows, "weights": weights}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        result = run_golden(Path(tmp))
    if "--record" in sys.argv:
        RECORDED.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
