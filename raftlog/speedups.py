"""The optional C extension raftline.raftlog._speedups (raftlog/_speedups.c), loaded once, and the
allocator settings for processes that move large buffers.

Owns the choice between C and pure Python: `C` is None when the extension is not built or
RAFTLINE_PURE_PYTHON=1 asks for the Python code; records.py, log.py and segment.py pick their
hot loops from it. Owns keep_large_buffers(), which nodes and clients call when they start.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("RAFTLINE_PURE_PYTHON") == "1":
        return None
    try:
        from raftline.raftlog import _speedups
    except ImportError:
        return None
    return _speedups


C = _load()

# glibc mallopt parameters (malloc.h) and the values keep_large_buffers sets.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
# Set to 1 to leave malloc as the environment configured it.
OPT_OUT_VARIABLE = "RAFTLINE_MALLOC_DEFAULTS"
# Each glibc setting and the environment variable that, when set, takes precedence over it.
_SETTINGS = (
    (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES, "MALLOC_MMAP_THRESHOLD_"),
    (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES, "MALLOC_TRIM_THRESHOLD_"),
)
_kept: bool | None = None  # the outcome of the first call; later calls return it


def keep_large_buffers() -> bool:
    """Let glibc's malloc keep and reuse freed buffers of up to 32 MiB. Returns whether the
    settings are in force. Once per process; nodes and clients call it when they start.

    Why: a node and its clients allocate and free a buffer the size of each record batch
    (request bodies, batches, fetch answers) per message. By default glibc serves a 1 MB
    allocation with mmap and unmaps it on free, or trims the freed top of its heap, so the
    next buffer page-faults ~250 freshly zeroed pages per MB: on the 1 MB-message benchmark
    that was about a third of the producer's and the consumer's CPU time. Cost: up to
    TRIM_THRESHOLD_BYTES of freed heap stay mapped in the process.

    Nothing is changed off glibc, when RAFTLINE_MALLOC_DEFAULTS=1, or for a setting whose
    glibc environment variable (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) is set.
    """
    global _kept
    if _kept is None:
        _kept = _set_malloc_options()
    return _kept


def _set_malloc_options() -> bool:
    if os.environ.get(OPT_OUT_VARIABLE) == "1" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied = False
    for parameter, value, variable in _SETTINGS:
        if variable not in os.environ:
            applied |= mallopt(parameter, value) == 1  # mallopt returns 1 on success
    return applied
