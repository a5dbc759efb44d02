"""The house: every import points down the layers, and no package imports itself back through another.

Layers, bottom to top (a module may import its own package and any lower layer, never a higher one):
``schemas`` -> ``model`` -> ``exporters`` -> ``simulator`` -> ``deploy.local`` -> ``beam_pipeline`` ->
``deploy.dataflow`` / ``deploy.container`` (image and template descriptions) -> ``trustbeam`` (the CLI and every
entry point, the Dataflow launcher's included) -> ``bench``, ``tests``.
Imports inside functions count too: a lazy import is still a dependency. And what an import costs: the command line
starts without PyTorch, Beam, Arrow or SciPy.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("schemas", "model", "exporters", "simulator", "deploy.local", "beam_pipeline", "deploy.dataflow",
          "deploy.container", "trustbeam", "bench", "tests")


def unit(module: str) -> str | None:
    """The layer a dotted module name belongs to (None: a third-party or standard module)."""
    return next((layer for layer in sorted(LAYERS, key=len, reverse=True)
                 if module == layer or module.startswith(layer + ".")), None)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file, top-level or nested."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names
                      if unit(f"{node.module}.{alias.name}") not in (None, unit(node.module))]
    return found


def edges() -> list[tuple[str, str, str]]:
    """(importing layer, imported layer, where) for every import across layers in the project."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in (".venv", "build", "out") or relative.parts[0].startswith("."):
            continue
        source = unit(".".join(relative.with_suffix("").parts))
        if source is None:
            continue
        for line, module in imports(path):
            target = unit(module)
            if target is not None and target != source:
                out.append((source, target, f"{relative}:{line} imports {module}"))
    return out


def test_no_import_points_up_a_layer() -> None:
    upward = [where for source, target, where in edges() if LAYERS.index(target) > LAYERS.index(source)]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_package_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for source, target, _ in edges():
        graph.setdefault(source, set()).add(target)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph.get(start, ()))

    cyclic = sorted(layer for layer in graph if reaches(layer, layer, set()))
    assert not cyclic, f"package cycles through {cyclic}"


def test_the_walk_sees_the_imports_it_judges() -> None:  # the check would pass vacuously on a broken walk
    found = {(s, t) for s, t, _ in edges()}
    assert {("model", "schemas"), ("beam_pipeline", "model"), ("trustbeam", "beam_pipeline"),
            ("simulator", "exporters"), ("deploy.dataflow", "beam_pipeline"), ("trustbeam", "deploy.local")} <= found
    assert unit("exporters.kafka_client") == "exporters" and unit("deploy.local.broker") == "deploy.local"


def test_the_command_line_starts_without_the_heavy_runtimes() -> None:
    """``trustbeam --help`` and the commands that score nothing start in well under a second: importing the CLI loads
    neither PyTorch, Beam, Arrow nor SciPy (a command that needs one imports it where it runs), and nothing in the
    scorer's import imports a graph library (torch-geometric's import, with torch._dynamo, cost ~3 s a process)."""
    heavy = ("torch", "apache_beam", "pyarrow", "scipy", "torch_geometric", "torch._dynamo")
    probe = ("import sys; import {module}; print(' '.join(m for m in {heavy!r} if m in sys.modules))")
    loaded = {module: subprocess.run([sys.executable, "-c", probe.format(module=module, heavy=heavy)], cwd=ROOT,
                                     capture_output=True, text=True, check=True).stdout.split()
              for module in ("trustbeam.cli", "model.scoring")}
    assert loaded["trustbeam.cli"] == []
    assert "torch" in loaded["model.scoring"]  # the probe sees what an import loads
    assert not {"torch_geometric", "torch._dynamo"} & set(loaded["model.scoring"])
