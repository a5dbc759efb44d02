"""Print benchmark figures as JSON and as an aligned table."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence


def peak_rss_kb(pid: int | str = "self") -> int:
    """VmHWM of a live process (its peak resident set), in kB; 0 once it is gone. Unlike ``ru_maxrss``, it starts
    afresh at exec: a child does not inherit the peak of the parent it was spawned from."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def progress(row: dict[str, Any]) -> dict[str, Any]:
    """``row``, after printing it to stderr as one JSON line the moment it is measured (a run killed at a time
    limit keeps the rows it finished)."""
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def table(rows: Sequence[dict[str, Any]]) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[_cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return f"{value:,.3f}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)


def emit(name: str, rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> None:
    print(json.dumps({"benchmark": name, **meta, "rows": list(rows)}, indent=2))
    print()
    print(table(rows))
