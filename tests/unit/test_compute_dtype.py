"""trainer.dtype 'auto': bf16 autocast only where the device's bf16 matmuls are the fast ones:
a CPU without AVX512-BF16/AMX runs bf16 GEMMs on a scalar fallback (~25x slower than fp32),
and one with AVX512-BF16 but no AMX may still run them slower than fp32 (measured by a probe)."""

from __future__ import annotations

import math

import pytest
import torch

from agent_core.trainer import compute_dtype
from agent_core.trainer.compute_dtype import BF16_MIN_SPEEDUP, resolve_compute_dtype


@pytest.mark.parametrize(("native", "expected"), [(True, "bfloat16"), (False, "float32")])
def test_auto_follows_native_bf16(monkeypatch, native: bool, expected: str) -> None:
    monkeypatch.setattr(compute_dtype, "native_bf16", lambda device_type: native)
    assert resolve_compute_dtype("auto", "cpu") == expected


def test_explicit_dtypes_are_kept(monkeypatch) -> None:
    monkeypatch.setattr(compute_dtype, "native_bf16", lambda device_type: False)
    assert resolve_compute_dtype("bfloat16", "cpu") == "bfloat16"
    assert resolve_compute_dtype("float32", "cpu") == "float32"


@pytest.mark.parametrize(
    ("speedup", "expected"),
    [(7.0, "bfloat16"), (BF16_MIN_SPEEDUP, "bfloat16"), (1.1, "float32"), (0.53, "float32")],
)
def test_cpu_with_bf16_instructions_takes_bf16_only_when_it_is_faster(
    monkeypatch, speedup: float, expected: str
) -> None:
    """7x: AMX; 0.53x: below the Xeon with AVX512-BF16 and no AMX of docs/results.md
    (0.62-0.64x); a near tie (1.1x) keeps fp32."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(compute_dtype, "cpu_bf16_speedup", lambda: speedup)
    assert resolve_compute_dtype("auto", "cpu") == expected


def test_a_cpu_with_amx_takes_bf16_without_timing_it(monkeypatch) -> None:
    """A probe timed on a busy box once picked fp32 on an AMX CPU (its bf16 GEMMs run ~7x faster)."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)

    def probe() -> float:
        raise AssertionError("AMX's bf16 GEMMs must not be timed")

    monkeypatch.setattr(compute_dtype, "cpu_bf16_speedup", probe)
    assert resolve_compute_dtype("auto", "cpu") == "bfloat16"


def test_cpu_without_bf16_instructions_never_probes(monkeypatch) -> None:
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)

    def probe() -> float:
        raise AssertionError("the scalar fallback must not be timed")

    monkeypatch.setattr(compute_dtype, "cpu_bf16_speedup", probe)
    assert resolve_compute_dtype("auto", "cpu") == "float32"


def test_this_machine_answers() -> None:
    assert isinstance(compute_dtype.native_bf16("cpu"), bool)
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        speedup = compute_dtype.cpu_bf16_speedup()
        assert math.isfinite(speedup) and speedup > 0
        assert compute_dtype.cpu_bf16_speedup() == speedup  # measured once per process
