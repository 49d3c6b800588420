"""Host allocator tuning for the emulated platform.

The reference operators build multi-megabyte temporaries every call (gathered K/V,
scores). glibc serves such blocks with fresh ``mmap`` pages by default, so every call
pays page faults on memory it just freed; in the emulated engine that was about two
thirds of the K/V gather time. Raising glibc's mmap and trim thresholds keeps those
blocks in the heap for reuse. Only the emulated platform calls this (vLLM's CPU
documentation recommends an allocator swap, tcmalloc, for the same reason).
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 256 << 20


def keep_large_blocks_in_heap(threshold: int = MMAP_THRESHOLD_MAX) -> bool:
    """Ask glibc to serve blocks below ``threshold`` from the heap and not trim it
    eagerly. Returns False (and changes nothing) where glibc is not the allocator."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, threshold)) and bool(
        mallopt(M_TRIM_THRESHOLD, 4 * threshold))
