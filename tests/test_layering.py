"""The house: every import points down the layers, and no package or module imports itself back through another.

Layers, bottom to top (a module may import its own package and any lower layer, never a higher one):
``schemas`` -> ``model`` -> ``exporters`` -> ``simulator`` -> ``deploy.local`` -> ``beam_pipeline`` ->
``deploy.dataflow`` / ``deploy.container`` (image and template descriptions) -> ``trustbeam`` (the CLI and every
entry point, the Dataflow launcher's included) -> ``bench``, ``tests``.
Imports inside functions count too: a lazy import is still a dependency. And what an import costs: the command line
starts without PyTorch, Beam, Arrow or SciPy.
"""

from __future__ import annotations

import ast
import functools
import os
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


@functools.cache
def syntax(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file, top-level, nested or for types only; ``from a import b``
    gives both a and a.b (b may be a module)."""
    found = []
    for node in ast.walk(syntax(path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


@functools.cache
def project_files() -> tuple[Path, ...]:
    """Every .py file of the project, sorted: the walk never enters hidden folders (the venv), builds or outputs."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in ("build", "out", "__pycache__")]
        found += [Path(folder) / name for name in files if name.endswith(".py")]
    return tuple(sorted(found))


@functools.cache
def edges() -> tuple[tuple[str, str, str], ...]:
    """(importing layer, imported layer, where) for every import across layers in the project."""
    out = []
    for path in project_files():
        relative = path.relative_to(ROOT)
        source = unit(".".join(relative.with_suffix("").parts))
        if source is None:
            continue
        for line, module in imports(path):
            target = unit(module)
            if target is not None and target != source:
                out.append((source, target, f"{relative}:{line} imports {module}"))
    return tuple(out)


def test_no_import_points_up_a_layer() -> None:
    upward = [where for source, target, where in edges() if LAYERS.index(target) > LAYERS.index(source)]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path of ``graph``'s edges from ``start`` back to it (start first and last), or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, trail = stack.pop()
        for after in sorted(graph.get(node, ())):
            if after == start:
                return trail + [start]
            if after not in seen:
                seen.add(after)
                stack.append((after, trail + [after]))
    return None


def test_no_package_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for source, target, _ in edges():
        graph.setdefault(source, set()).add(target)
    cyclic = sorted(layer for layer in graph if cycle_through(graph, layer))
    assert not cyclic, f"package cycles through {cyclic}"


def module_of(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    return ".".join(relative.parts[:-1] if relative.name == "__init__" else relative.parts)


def test_no_module_cycle() -> None:
    """A lazy import inside a function, or one under ``if TYPE_CHECKING:``, hides a cycle from the interpreter, not from
    the design: each such pair (model.baselines and model.train, model.publisher and model.scoring, once) has a lower
    home for what both need (model.targets, model.published)."""
    paths = {module_of(path): path for path in project_files() if unit(module_of(path)) is not None}
    graph = {module: {imported for _, imported in imports(path) if imported in paths} - {module}
             for module, path in paths.items()}
    assert graph["model.baselines"] and "model.targets" in graph["model.train"]  # the walk sees the imports
    cycles = [" -> ".join(trail) for module in sorted(graph) if (trail := cycle_through(graph, module))]
    assert not cycles, "modules that import themselves back:\n" + "\n".join(cycles)


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
