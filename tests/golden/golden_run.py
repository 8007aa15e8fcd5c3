"""The golden run: the smoke preset on the tiny model for 2 iterations with fixed seeds, one
torch thread, fp32 and torch's AVX2 kernels, digested into the rows of each iteration and the
final weights. `digests.json` holds the recorded digest; `tests/integration/test_golden_run.py`
runs the golden run again and requires the same digest.

Every column that is not a float of the policy's math (token ids, text, rewards, advantages,
info) must match bit for bit. The policy's floats (`FLOAT_COLUMNS`, the final weights) must
match within `LOGPROB_ATOL` and `WEIGHT_ATOL`: with the same kernels pinned, an AMD EPYC box
and an Intel Xeon box still round the GEMMs differently (the bit-exact digest recorded on the
Xeon failed on the EPYC in `response_logprobs` of iteration 1 only). Measured on the EPYC,
between the pinned run and runs with AVX-512 kernels, two threads or MKL_CBWR=COMPATIBLE: token
ids equal, log-probs at most 2.4e-6 apart, weights at most 2.2e-5 apart per element.

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
import zlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from safetensors.numpy import load_file

REPO = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).with_name("digests.json")
# what differs between two runs of the same code: the MLflow run id (a fresh uuid) and the
# wall-clock timestamps in each step's info
RANDOM_COLUMNS = ("run_id",)
WALL_CLOCK_INFO_KEYS = ("timing",)
# floats that come out of the policy's forward pass: kept as values, compared within LOGPROB_ATOL
FLOAT_COLUMNS = ("response_logprobs", "value")
# 40x the largest gap measured between boxes and kernel choices (module docstring)
LOGPROB_ATOL = 1e-4
# on each tensor's L2 norm and its PROBES sums of +-1-signed elements: a rounding gap moves them
# by about the gap's L2 norm (measured <= 2.4e-5, so 20x that); a change of 1e-4 in every element
# of a 64x128 matrix moves them by ~9e-3
WEIGHT_ATOL = 5e-4
PROBES = 2
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
        columns: dict = {}
        for name in table.column_names:
            if name in RANDOM_COLUMNS:
                continue
            values = table.column(name).to_pylist()
            if name in FLOAT_COLUMNS:
                columns[name] = values
                continue
            if name == "info":
                values = [_clean_info(v) for v in values]
            columns[name] = hashlib.sha256(repr(values).encode()).hexdigest()
        rows[part.name] = columns
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    tensors = load_file(run_dir / "checkpoints" / latest / "model.safetensors")
    weights = {name: _tensor_digest(name, tensors[name]) for name in sorted(tensors)}
    return {"checkpoint": latest, "rows": rows, "weights": weights}


def _tensor_digest(name: str, tensor: np.ndarray) -> list[float]:
    """The tensor's L2 norm and PROBES sums of its elements under random signs fixed by its name."""
    flat = tensor.astype(np.float64).ravel()
    signs = np.random.default_rng(zlib.crc32(name.encode())).choice(
        [-1.0, 1.0], (PROBES, flat.size)
    )
    return [float(np.linalg.norm(flat)), *(float(x) for x in signs @ flat)]


def _floats_apart(recorded: list | None, now: list | None) -> bool:
    """Whether two columns of float values (lists per row, or one float per row, or None)
    differ in shape or by more than LOGPROB_ATOL anywhere."""
    if recorded is None or now is None:
        return recorded is not now
    if isinstance(recorded, list):
        return (
            not isinstance(now, list)
            or len(recorded) != len(now)
            or any(_floats_apart(a, b) for a, b in zip(recorded, now, strict=True))
        )
    return isinstance(now, list) or abs(recorded - now) > LOGPROB_ATOL


def differences(recorded: dict, now: dict) -> list[str]:
    """What moved between two digests, one line each (empty: the same run)."""
    moved = []
    if now["checkpoint"] != recorded["checkpoint"]:
        moved.append(f"last checkpoint: {now['checkpoint']}, recorded {recorded['checkpoint']}")
    if now["rows"].keys() != recorded["rows"].keys():
        moved.append(f"iterations: {sorted(now['rows'])}, recorded {sorted(recorded['rows'])}")
    for part, columns in recorded["rows"].items():
        current = now["rows"].get(part, {})
        for name, value in columns.items():
            apart = (
                _floats_apart(value, current.get(name))
                if name in FLOAT_COLUMNS
                else current.get(name) != value
            )
            if apart:
                moved.append(f"{part}: step-row column {name}")
    if now["weights"].keys() != recorded["weights"].keys():
        moved.append(
            f"weight tensors: {sorted(now['weights'])}, recorded {sorted(recorded['weights'])}"
        )
    for name, value in recorded["weights"].items():
        got = now["weights"].get(name)
        if got is None or max(abs(a - b) for a, b in zip(value, got, strict=True)) > WEIGHT_ATOL:
            moved.append(f"final weights: {name} (norm and probes {got}, recorded {value})")
    return moved


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        result = run_golden(Path(tmp))
    if "--record" in sys.argv:
        RECORDED.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
