"""Where trustbeam keeps local state (broker PID files and logs, the ns-3 cache)."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """``TRUSTBEAM_STATE_DIR``, default ``~/.local/state/trustbeam``."""
    return Path(os.environ.get("TRUSTBEAM_STATE_DIR") or Path.home() / ".local" / "state" / "trustbeam")
