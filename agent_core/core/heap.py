"""The process's C heap (glibc malloc), set once at process start: every block of 4 MiB or more
(logits, activations, KV caches) mapped on its own, so that freeing it returns it to
the OS at once instead of leaving it in an arena until `malloc_trim`; smaller blocks are reused
from the arenas (mapping those too cost a full fine-tune step twice its time in page faults)."""

from __future__ import annotations

import contextlib
import ctypes
import os

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's default starts at 128 KiB and rises to the largest block freed so far (up to 32 MiB),
# after which freed activations and logits stay in the arenas; a fixed threshold stops the rise.
# A lower one maps every tensor and pays a page fault per page of each; the arena count is left
# at glibc's (a cap slowed steps and lowered no peak): the measured trade in docs/scaling.md
MMAP_THRESHOLD = 4 * 1024 * 1024
# a free arena top above this goes back to the OS (glibc's dynamic rule: twice the threshold)
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
# (environment variable that sets the same, and wins; mallopt parameter; value)
SETTINGS = (
    ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, TRIM_THRESHOLD),
)


def settle_heap() -> dict[str, int]:
    """Fix the mmap and trim thresholds, each unless its environment variable is set; returns
    what was set (by variable name), nothing where malloc is not glibc's."""
    done: dict[str, int] = {}
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: not glibc
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: no library lookup
        for name, param, value in SETTINGS:
            if name not in os.environ and mallopt(param, value) == 1:
                done[name] = value
    return done
