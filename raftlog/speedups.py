"""The optional C extension raftline.raftlog._speedups (raftlog/_speedups.c), loaded once.

Owns the choice between C and pure Python: `C` is None when the extension is not built or
RAFTLINE_PURE_PYTHON=1 asks for the Python code; records.py, log.py and segment.py pick their
hot loops from it.
"""

from __future__ import annotations

import os
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
