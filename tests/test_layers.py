"""The package layering of docs/architecture.md, enforced: no import points up the order, no cycle between packages.

Every import statement counts, also those inside functions (a lazy import is still a dependency).
The order is read from the doc's ``layers`` block, so the doc and the test cannot disagree.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "mindfoundry"
#: Only these packages may import an engine framework; everything else is framework-free.
FRAMEWORKS = {"mindspore", "torch"}
ENGINE_PACKAGE = "backends"


def layer_order(doc: Path = REPO / "docs" / "architecture.md") -> list[set[str]]:
    """The ```layers block of the doc: one line per layer, lowest first; packages of one layer joined by '|'."""
    block = re.search(r"```layers\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)
    assert block, f"{doc} has no ```layers block"
    return [{p.strip() for p in line.split("|")} for line in block.group(1).splitlines() if line.strip()]


def imported_modules(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in `source`, nested ones included; relative imports resolved."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + int(is_package)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            # `from mindfoundry import config` imports the package mindfoundry.config
            names = [f"{name}.{a.name}" for a in node.names] if name == "mindfoundry" else [name]
            out += [(node.lineno, n) for n in names]
    return out


def package_of(module: str) -> str | None:
    """The top package under mindfoundry (None for mindfoundry itself and for other libraries)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "mindfoundry" and len(parts) > 1 else None


def violations(modules: dict[str, tuple[str, bool]], layers: list[set[str]]) -> list[str]:
    """Every import that points up or sideways in `layers`, every framework import outside the engines, and every
    cycle between packages. `modules`: module name -> (source, is_package)."""
    level = {pkg: i for i, group in enumerate(layers) for pkg in group}
    problems, edges = [], {}
    for module, (source, is_package) in sorted(modules.items()):
        src = package_of(module)
        if src is None:
            continue
        if src not in level:
            problems.append(f"{module}: package '{src}' is not in the layer order of docs/architecture.md")
            continue
        for line, target in imported_modules(module, source, is_package):
            if target.split(".")[0] in FRAMEWORKS and src != ENGINE_PACKAGE:
                problems.append(
                    f"{module}:{line} imports {target}: only {ENGINE_PACKAGE}/ may import an engine framework"
                )
            dst = package_of(target)
            if dst is None or dst == src:
                continue
            edges.setdefault(src, set()).add(dst)
            if dst not in level:
                problems.append(f"{module}:{line} imports {target}: package '{dst}' is not in the layer order")
            elif level[dst] >= level[src]:
                way = "up" if level[dst] > level[src] else "sideways"
                problems.append(f"{module}:{line} imports {target}: {src} may not import {dst} ({way} the layer order)")
    return problems + [f"import cycle between packages: {' -> '.join(c)}" for c in cycles(edges)]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of packages (depth-first search)."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def source_modules(root: Path = SRC) -> dict[str, tuple[str, bool]]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path.read_text(encoding="utf-8"), is_package)
    return out


def test_every_import_follows_the_layer_order() -> None:
    layers = layer_order()
    listed = [pkg for group in layers for pkg in group]
    on_disk = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").is_file())
    on_disk += sorted(p.stem for p in SRC.glob("*.py") if p.name != "__init__.py")  # top-level modules (errors.py)
    assert sorted(listed) == sorted(on_disk)  # every package has a layer, every layer a package
    assert violations(source_modules(), layers) == []


LAYERS = [{"config"}, {"data"}, {"checkpoint", "monitor"}, {"train"}]


def test_an_upward_import_fails() -> None:
    """A lazy import inside a function, pointing up: found, with the file line and the two packages."""
    bad = "def defaults():\n    from mindfoundry.train.trainer import Trainer\n    return Trainer\n"
    assert violations({"mindfoundry.config.bad": (bad, False)}, LAYERS) == [
        "mindfoundry.config.bad:2 imports mindfoundry.train.trainer: config may not import train (up the layer order)"]


def test_a_sideways_import_a_relative_import_and_a_cycle_fail() -> None:
    modules = {
        "mindfoundry.monitor.sink": ("from mindfoundry.checkpoint import store\n", False),
        "mindfoundry.checkpoint.store": ("from ..monitor import sink\n", False),
        "mindfoundry.data.ok": ("from mindfoundry.config.schema import RunConfig\nimport numpy\n", False),
    }
    assert violations(modules, LAYERS) == [
        "mindfoundry.checkpoint.store:1 imports mindfoundry.monitor: checkpoint may not import monitor (sideways the "
        "layer order)",
        "mindfoundry.monitor.sink:1 imports mindfoundry.checkpoint: monitor may not import checkpoint (sideways the "
        "layer order)",
        "import cycle between packages: checkpoint -> monitor -> checkpoint",
    ]


def test_framework_imports_stay_in_the_engines() -> None:
    modules = {"mindfoundry.data.fast": ("def f():\n    import torch\n", False),
               "mindfoundry.backends.x": ("import mindspore as ms\n", False)}
    assert violations(modules, [{"config"}, {"data"}, {"backends"}]) == [
        "mindfoundry.data.fast:2 imports torch: only backends/ may import an engine framework"]


@pytest.mark.parametrize("doc", ["no block here\n", "```layers\nconfig\n```\n"])
def test_the_order_comes_from_the_doc(tmp_path: Path, doc: str) -> None:
    path = tmp_path / "architecture.md"
    path.write_text(doc)
    if "```layers" in doc:
        assert layer_order(path) == [{"config"}]
    else:
        with pytest.raises(AssertionError, match="no ```layers block"):
            layer_order(path)


def test_no_source_file_over_500_lines() -> None:
    """Small modules with one job each: a file past 500 lines is a sign it holds two."""
    long = {path.relative_to(SRC).as_posix(): n for path in SRC.rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}
