"""What `trainer.dtype: auto` trains in: bf16 autocast where the device multiplies bf16
matrices faster than fp32, else fp32.

A CUDA GPU with bf16 support takes bf16. On a CPU, having bf16 instructions is not enough: with
AMX a bf16 GEMM ran ~7x faster than fp32 (2050 against 297 GFLOP/s), without AVX512-BF16 or AMX
oneDNN falls back to a scalar GEMM (~25x slower), and on an Intel Xeon with AVX512-BF16 but no
AMX it ran at about half of fp32's speed (160 against 300 GFLOP/s), which made a forward and
backward 1.7x and an update 1.56x slower in bf16 autocast (docs/results.md: bench/dtype.py, and
its earlier results, "The update in bf16 where bf16 is slower"). So a CPU with AMX takes bf16,
and one with bf16 instructions but no AMX is measured once per process: a GEMM of the default
model's shape in both dtypes, bf16 only where it is at least `BF16_MIN_SPEEDUP` times faster (a
probe on a busy box once picked fp32 beside AMX, whose bf16 GEMMs run ~7x faster).
"""

from __future__ import annotations

import functools
import logging
import time

import torch

log = logging.getLogger(__name__)

# bf16 must beat fp32 by this factor on the probe: a near tie keeps the more precise fp32 (and
# keeps timing noise from flipping the choice between runs on one machine)
BF16_MIN_SPEEDUP = 1.25
# the probe: [tokens x hidden] @ [hidden x mlp] of SmolLM2-135M, a micro-batch's worth of rows
_PROBE_SHAPE = (256, 576, 1536)


def resolve_compute_dtype(dtype: str, device_type: str) -> str:
    """'auto' -> 'bfloat16' where the device's bf16 matmuls are the fast ones, else
    'float32'; an explicit dtype is kept."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if native_bf16(device_type) else "float32"


def native_bf16(device_type: str) -> bool:
    """Whether the device multiplies bf16 matrices natively and faster than fp32."""
    if device_type == "cuda":
        return torch.cuda.is_bf16_supported()
    # oneDNN's bf16 GEMMs need AVX512-BF16 or AMX; without them a scalar fallback runs
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    # AMX's bf16 GEMMs are the fast ones (~7x); timing them on a busy box could pick fp32 and
    # train at a seventh of the speed, so only a CPU without AMX is timed
    if torch.cpu._is_amx_tile_supported():
        return True
    return cpu_bf16_speedup() >= BF16_MIN_SPEEDUP


@functools.cache
def cpu_bf16_speedup() -> float:
    """How many times faster a bf16 GEMM of the probe's shape runs than an fp32 one on this
    CPU with this process's threads (best of 5 each, after 2 untimed; ~50 ms on 2 cores)."""
    seconds = {dt: _best_matmul_seconds(dt) for dt in (torch.float32, torch.bfloat16)}
    speedup = seconds[torch.float32] / seconds[torch.bfloat16]
    log.info(
        "trainer.dtype auto: a bf16 GEMM runs %.2fx the speed of fp32 on this CPU (bf16 when "
        ">= %.2fx)",
        speedup,
        BF16_MIN_SPEEDUP,
    )
    return speedup


def _best_matmul_seconds(dtype: torch.dtype) -> float:
    rows, inner, cols = _PROBE_SHAPE
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(rows, inner, generator=gen).to(dtype)
    b = torch.randn(inner, cols, generator=gen).to(dtype)
    for _ in range(2):
        torch.mm(a, b)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)
