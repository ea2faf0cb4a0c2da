"""The project's modules form no import circle, share no private names, and the config loader
stands on nothing of the project (issue #42).

Circles: the import graph is grimp's (the one `lint-imports` checks), every import counted, those
inside functions and under `if TYPE_CHECKING:` included: a circle hidden in a function is still
two modules that cannot be understood, tested or moved one without the other. A circle is a
strongly connected component of more than one module; the failure lists each with one shortest
circle through it.

Packages: grimp records only the imports written in the code. `from pkg import sub` (a submodule) is
an edge to `pkg.sub`, `from pkg import Name` one to `pkg` (its `__init__`); that Python runs
`pkg/__init__.py` before any `pkg.sub` is no edge. So an `__init__` that re-exports its submodules
is no circle (the submodules do not import it), while a submodule that takes a name from its own
package's `__init__`, which imports that submodule, is one -- a real one: the name exists only if
the `__init__` got that far first. `test_a_package_reexporting_its_submodules_is_no_circle` pins
this reading of grimp's graph.

Private names: `_name` is a module's own; a second module that needs it needs a public name in a
module both can import (`from pkg.mod import _x` or `mod._x` across files fail here; tests are not
checked, dunders such as `__version__` are public).
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

from support.paths import REPO_ROOT

ROOTS = ("specexit_core", "pipelines", "serve_app", "specexit_app", "cluster")


def circles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), sorted."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & graph.modules) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(edges[v]):
                work.append((v, i + 1))
                w = edges[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
            if work:  # back in the caller: its low link takes the callee's
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return sorted(found)


def one_circle(graph, component: list[str]) -> list[str]:
    """A shortest circle through the component's first module (every path between two modules of
    one component stays in it)."""
    start = component[0]
    best = None
    for nxt in sorted(graph.find_modules_directly_imported_by(start) & set(component)):
        chain = graph.find_shortest_chain(importer=nxt, imported=start)
        if chain and (best is None or len(chain) < len(best)):
            best = chain
    return [start, *best]


def describe(graph, components: list[list[str]]) -> str:
    return "\n".join(f"{' -> '.join(one_circle(graph, c))}  (component: {', '.join(c)})" for c in components)


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(*ROOTS, cache_dir=None)


def test_no_import_circles(graph):
    found = circles(graph)
    assert not found, f"{len(found)} import circle(s):\n{describe(graph, found)}"


def test_the_config_loader_imports_nothing_of_the_project(graph):
    """The import-linter contract in pyproject.toml names today's subpackages; this covers any."""
    imported = graph.find_modules_directly_imported_by("specexit_core.typed_config")
    assert not imported, sorted(imported)


def test_a_package_reexporting_its_submodules_is_no_circle(tmp_path, monkeypatch):
    files = {
        # an __init__ re-exporting its submodules, which import each other and the package's siblings
        "cyc_fine/__init__.py": "from cyc_fine.a import A\nfrom cyc_fine.b import B\n",
        "cyc_fine/a.py": "from cyc_fine import b\nA = b.B\n",
        "cyc_fine/b.py": "B = 1\n",
        # a submodule taking a name from its own package's __init__, which imports it
        "cyc_loop/__init__.py": "from cyc_loop.a import A\nBASE = 1\n",
        "cyc_loop/a.py": "from cyc_loop import BASE\nA = BASE\n",
        # two modules importing each other, one of them only inside a function
        "cyc_lazy/__init__.py": "",
        "cyc_lazy/a.py": "import cyc_lazy.b\n",
        "cyc_lazy/b.py": "def f():\n    from cyc_lazy import a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    g = grimp.build_graph("cyc_fine", "cyc_loop", "cyc_lazy", cache_dir=None)
    assert circles(g) == [["cyc_lazy.a", "cyc_lazy.b"], ["cyc_loop", "cyc_loop.a"]]
    assert one_circle(g, ["cyc_loop", "cyc_loop.a"]) == ["cyc_loop", "cyc_loop.a", "cyc_loop"]


def project_files() -> list[Path]:
    return sorted(p for root in ROOTS for p in (REPO_ROOT / root).rglob("*.py"))


def module_name(path: Path, top: Path = REPO_ROOT) -> str:
    parts = path.relative_to(top).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(path: Path, modules: set[str], top: Path = REPO_ROOT) -> list[str]:
    """`from M import _x` (M a project module, absolute or relative) and `m._x` where `m` is a
    project module bound by an import, in the file `path` (under the folder `top`)."""
    here = module_name(path, top)
    where = path.relative_to(top)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}  # local name -> the project module it is
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top_name = a.name.split(".")[0]
                if top_name in ROOTS:  # `import a.b` binds `a`; `import a.b as m` binds `m` to a.b
                    bound[a.asname or top_name] = a.name if a.asname else top_name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            if base.split(".")[0] not in ROOTS:
                continue
            for a in node.names:
                if is_private(a.name) and base != here:
                    found.append(f"{where}:{node.lineno}: from {base} import {a.name}")
                if f"{base}.{a.name}" in modules:
                    bound[a.asname or a.name] = f"{base}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                owner = ".".join([bound[value.id], *reversed(chain)])
                if owner != here:
                    found.append(f"{where}:{node.lineno}: {owner}.{node.attr}")
    return found


def test_no_private_names_across_modules():
    files = project_files()
    modules = {module_name(p) for p in files}
    found = [use for p in files for use in private_uses(p, modules)]
    assert not found, "private names used from another module:\n" + "\n".join(found)


def test_the_private_name_check_sees_imports_and_attributes(tmp_path):
    pkg = tmp_path / "pipelines" / "x"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_K = 1\nK = _K\n__all__ = ['K']\n")
    (pkg / "b.py").write_text(
        "from pipelines.x.a import _K, __all__\nfrom pipelines.x import a\nfrom . import a as aa\n"
        "import pipelines.x.a\nimport pipelines.x.a as m\n"
        "a._K, aa._K, pipelines.x.a._K, m._K, a.K, __all__\n"
        "from .a import _K as K2\n"
    )
    modules = {"pipelines", "pipelines.x", "pipelines.x.a", "pipelines.x.b"}
    got = [u.split(": ", 1)[1] for u in private_uses(pkg / "b.py", modules, tmp_path)]
    assert got == [
        "from pipelines.x.a import _K",
        "from pipelines.x.a import _K",
        "pipelines.x.a._K",
        "pipelines.x.a._K",
        "pipelines.x.a._K",
        "pipelines.x.a._K",
    ]
    assert private_uses(pkg / "a.py", modules, tmp_path) == []
