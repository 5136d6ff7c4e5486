"""The package's layers (README, Architecture): a module may import its own layer and the layers below it,
never one above. Every import counts, including the ones inside functions."""
import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib" / "specdec"
# rank of each layer (a subpackage, or a top-level module); lower layers never import higher ones
RANK = {"errors": 0, "paths": 0, "__init__": 0, "data": 1, "engines": 2, "model": 3, "report": 4, "studies": 5,
        "cli": 6, "nbrefresh": 6, "__main__": 6}


def _layer(parts: tuple) -> str:
    """The layer of module specdec.<parts...> (parts without 'specdec')."""
    return parts[0] if parts else "__init__"


def _imports(path: Path, root: Path):
    """(module parts, imported specdec module parts, line, at module level) for every import in `path`."""
    rel = path.relative_to(root).with_suffix("").parts
    pkg = rel[:-1]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                target = base + tuple(node.module.split(".")) if node.module else base
            elif node.module and node.module.split(".")[0] == "specdec":
                target = tuple(node.module.split(".")[1:])
            else:
                continue
            for a in node.names:  # a module of a package, or a name in a module
                yield rel, target + (a.name,), node.lineno, id(node) in top
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "specdec":
                    yield rel, tuple(a.name.split(".")[1:]), node.lineno, id(node) in top


def upward_imports(root: Path) -> list[str]:
    """'module:line imports target (layer a -> layer b)' for every import that runs to a higher layer, and for
    every module that is in no known layer."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("").parts
        if _layer(rel) not in RANK:
            bad.append(f"{'/'.join(rel)}: in no layer (add it to a subpackage, or to RANK)")
            continue
        for mod, target, line, _ in _imports(path, root):
            a, b = _layer(mod), _layer(target)
            if RANK.get(b, 99) > RANK[a]:
                bad.append(f"{'.'.join(mod)}:{line} imports {'.'.join(target)} ({a} -> {b})")
    return bad


def module_cycles(root: Path) -> list[list[str]]:
    """Cycles among module-level imports (an import inside a function does not run at import time)."""
    graph = {}
    mods = {p.relative_to(root).with_suffix("").parts for p in root.rglob("*.py")}
    for path in root.rglob("*.py"):
        for mod, target, _, top in _imports(path, root):
            if not top:
                continue
            for t in (target, target + ("__init__",), target[:-1], target[:-1] + ("__init__",)):
                if t in mods:  # the module itself, or the module a name was imported from
                    if t != mod:
                        graph.setdefault(mod, set()).add(t)
                    break
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                cycles.append([".".join(x) for x in stack[stack.index(n):] + [n]])
            elif n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_no_import_runs_upward():
    assert upward_imports(LIB) == []


def test_no_cycle_among_module_level_imports():
    assert module_cycles(LIB) == []


def test_every_layer_is_a_package_with_a_docstring():
    for layer in ("data", "engines", "model", "report", "studies"):
        init = LIB / layer / "__init__.py"
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text())), layer


@pytest.mark.parametrize("where, text, expect", [
    ("data/x.py", "from ..report import views\n", "data.x:1 imports report.views (data -> report)"),
    ("engines/x.py", "def f():\n    from ..model.costmodel import CostModel\n",
     "engines.x:2 imports model.costmodel.CostModel (engines -> model)"),
    ("model/x.py", "import specdec.studies\n", "model.x:1 imports studies (model -> studies)"),
    ("stray.py", "", "stray: in no layer"),
])
def test_the_check_catches_an_upward_import(tmp_path, where, text, expect):
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    (tmp_path / "report").mkdir(exist_ok=True)
    (tmp_path / "report" / "views.py").write_text("from ..data import x\n")
    found = upward_imports(tmp_path)
    assert any(line.startswith(expect) for line in found), found


def test_the_cycle_check_catches_a_cycle(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.py").write_text("from . import b\n")
    (tmp_path / "data" / "b.py").write_text("from .a import thing\n")
    (tmp_path / "data" / "c.py").write_text("def f():\n    from . import a\n")  # lazy: no cycle
    assert module_cycles(tmp_path) == [["data.a", "data.b", "data.a"]]
