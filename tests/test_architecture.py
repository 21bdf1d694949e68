"""The package's shape: no import circle, arrows only downward through the layers, no private
name imported across packages. The allowed direction is written once, in LAYERS."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import fedpriv

ROOT = Path(fedpriv.__file__).parent

#: Lowest first. A module may import modules of its own package and of packages in LOWER layers
#: only; packages sharing a layer do not import each other.
LAYERS: list[set[str]] = [
    {"errors", "logs"},
    {"jsonio"},
    {"data", "models"},
    {"vocab", "privacy"},
    {"config"},
    {"rundir"},
    {"tasks"},
    {"memorization"},
    {"training"},
    {"central", "clients"},
    {"strategies"},
    {"engines"},
    {"report"},
    {"runner"},
    {"cli", "__init__"},
]
LAYER_OF = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def imports(mods: dict[str, Path]) -> dict[str, set[tuple[str, str | None]]]:
    """module -> {(imported module, imported name or None)} for every import statement,
    including those inside functions."""
    out: dict[str, set[tuple[str, str | None]]] = defaultdict(set)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out[name].update((a.name, None) for a in node.names if a.name.startswith("fedpriv"))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("fedpriv"):
                    continue
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    out[name].add((sub, None) if sub in mods else (target, a.name))
    return out


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_package_has_a_layer():
    missing = sorted({top(m) for m in modules()} - set(LAYER_OF))
    assert not missing, f"packages without a layer in LAYERS: {missing}"


def test_no_import_circle():
    mods = modules()
    graph = {m: {t for t, _ in targets if t in mods and t != m} for m, targets in imports(mods).items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in mods:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_arrows_point_down():
    mods = modules()
    wrong = []
    for m, targets in imports(mods).items():
        for t, _ in targets:
            a, b = top(m), top(t)
            if b == "__init__" and t == "fedpriv":  # `from fedpriv import __version__`
                continue
            if a != b and LAYER_OF[b] >= LAYER_OF[a]:
                wrong.append(f"{m} -> {t}")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(sorted(wrong))


def test_no_private_name_across_packages():
    mods = modules()
    crossing = [f"{m} imports {t}.{n}" for m, targets in imports(mods).items() for t, n in targets if n and n.startswith("_") and not n.startswith("__") and top(m) != top(t)]
    assert not crossing, "\n".join(sorted(crossing))
