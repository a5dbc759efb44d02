"""The worker images' requirement files, derived from setup.py so the two never drift.

``requirements.txt`` (CPU image) is setup.py's ``INSTALL_REQUIRES`` plus the ``onnx`` and ``cloud``
extras; ``requirements-cuda.txt`` (CUDA image) is ``INSTALL_REQUIRES`` plus the ``gpu`` extra (mamba-ssm,
causal-conv1d, onnxruntime-gpu: never beside onnxruntime) and ``cloud``. setup.py's lists are literals, read here
with ``ast`` without running setup.py.

    python -m deploy.container.requirements           # rewrite the files
    python -m deploy.container.requirements --check   # exit 1 if they are stale
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VARIANTS = {"requirements.txt": ("onnx", "cloud"), "requirements-cuda.txt": ("gpu", "cloud")}
HEADER = "# Generated from setup.py by `python -m deploy.container.requirements`; do not edit.\n"


def setup_lists(setup_py: Path = ROOT / "setup.py") -> tuple[list[str], dict[str, list[str]]]:
    """(INSTALL_REQUIRES, EXTRAS) as written in setup.py."""
    values = {}
    for node in ast.parse(setup_py.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("INSTALL_REQUIRES", "EXTRAS"):
                values[node.targets[0].id] = ast.literal_eval(node.value)
    return values["INSTALL_REQUIRES"], values["EXTRAS"]


def expected() -> dict[str, str]:
    install, extras = setup_lists()
    return {name: HEADER + "".join(f"{r}\n" for r in install + [r for extra in chosen for r in extras[extra]])
            for name, chosen in VARIANTS.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for name, text in expected().items():
        path = HERE / name
        if not path.exists() or path.read_text() != text:
            stale.append(name)
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run python -m deploy.container.requirements", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
