"""The shape of codegen/ (issue 17): no import circle among its modules, no file over 600 lines,
and the shared LLVM layer (codegen/llvm) never importing a target.

Imports are read from the source with ``ast``, anywhere in a file (inside functions too: an
import deferred to run time still ties the two modules together). ``from pkg import name``
imports the submodule ``pkg.name`` when there is one, else ``pkg``; a package's ``__init__``
that imports its submodules (to re-export them) imports them. Only explicit imports count:
that Python runs a package's ``__init__`` before its submodules is no edge.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
CODEGEN = ROOT / "codegen"
PACKAGE = "mlpack.codegen"
MAX_LINES = 600
LLVM = f"{PACKAGE}.llvm"
TARGETS = f"{PACKAGE}.targets"


def module_files(folder: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """Every module under ``folder`` by its dotted name (a package by its ``__init__``)."""
    out = {}
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join((package, *parts))] = path
    return out


def imported_names(path: pathlib.Path, name: str, known: set[str]) -> set[str]:
    """The dotted names ``path`` (module ``name``) imports anywhere in it: for ``from pkg import
    x``, ``pkg.x`` when that is a module in ``known``, else ``pkg``."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # relative: from the module's package, one level up per extra dot
                anchor = name.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    return out


def import_graph(folder: pathlib.Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (the closest enclosing module of each
    imported name that is one of them)."""
    files = module_files(folder, package)
    known = set(files)
    graph = {}
    for name, path in files.items():
        edges = set()
        for target in imported_names(path, name, known):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each group of modules that import each other, directly or through others (a strongly
    connected component of more than one module: Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) in each of ``circles``: a shortest path from the group's
    first module back to it."""
    out = []
    for group in circles(graph):
        start, members = group[0], set(group)
        paths = {start: [start]}
        frontier = [start]
        while frontier and start not in {w for v in frontier for w in graph[v]}:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in graph[v])
        out.append(paths[last] + [start])
    return out


def long_files(folder: pathlib.Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Every text file under ``folder`` longer than ``limit`` lines, with its line count."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        try:
            n = len(path.read_text().splitlines())
        except UnicodeDecodeError:
            continue
        if n > limit:
            out[str(path.relative_to(folder.parent))] = n
    return out


def forbidden_imports(folder: pathlib.Path, package: str, layer: str,
                      forbidden: str) -> dict[str, list[str]]:
    """Modules of ``layer`` that import ``forbidden`` or anything in it, with what they import."""
    files = module_files(folder, package)
    out = {}
    for name, path in files.items():
        if name != layer and not name.startswith(layer + "."):
            continue
        hits = sorted(t for t in imported_names(path, name, set(files))
                      if t == forbidden or t.startswith(forbidden + "."))
        if hits:
            out[name] = hits
    return out


# ---------------------------------------------------------------- the checks on codegen/


def test_no_import_cycle_in_codegen():
    graph = import_graph(CODEGEN, PACKAGE)
    found = [f"{' -> '.join(cycle)} (one cycle among {', '.join(group)})"
             for cycle, group in zip(cycles(graph), circles(graph))]
    assert not found, "import cycles in codegen/: " + "; ".join(found)


def test_no_codegen_file_over_the_line_limit():
    found = long_files(CODEGEN)
    assert not found, f"codegen/ files over {MAX_LINES} lines: {found}"


def test_llvm_layer_imports_no_target():
    assert (CODEGEN / "llvm").is_dir()
    found = forbidden_imports(CODEGEN, PACKAGE, LLVM, TARGETS)
    assert not found, f"codegen/llvm imports codegen/targets: {found}"


# ---------------------------------------------------------------- each check can fail


def _tree(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checks_find_what_they_look_for(tmp_path):
    P = "pkg"
    root = _tree(tmp_path / "pkg", {
        "__init__.py": "",
        "llvm/__init__.py": "",
        "llvm/emit.py": "def f():\n    from pkg.targets.cpu import kernels\n",
        "llvm/types.py": "import os\n",
        "targets/__init__.py": "",
        "targets/cpu/__init__.py": "from pkg.targets.cpu.compile import go  # re-export\n",
        # a circle through a function-level import and a package re-export:
        # compile -> kernels -> (in a function) cpu package -> compile
        "targets/cpu/compile.py": "from pkg.targets.cpu import kernels\ngo = 1\n",
        "targets/cpu/kernels.py": "import pkg.llvm.types\ndef g():\n"
                                  "    from pkg.targets import cpu\n",
        "targets/cpu/plan.py": "from pkg.targets.cpu.kernels import g\n" + "x = 1\n" * 700,
    })
    graph = import_graph(root, P)
    assert graph["pkg.targets.cpu.plan"] == {"pkg.targets.cpu.kernels"}
    assert graph["pkg.targets.cpu.kernels"] == {"pkg.llvm.types", "pkg.targets.cpu"}
    assert cycles(graph) == [["pkg.targets.cpu", "pkg.targets.cpu.compile",
                              "pkg.targets.cpu.kernels", "pkg.targets.cpu"]]
    assert circles({"a": {"b"}, "b": set()}) == [] and cycles({"a": {"b"}, "b": set()}) == []
    assert circles({"a": {"b"}, "b": {"c", "a"}, "c": {"b"}}) == [["a", "b", "c"]]
    assert long_files(root) == {"pkg/targets/cpu/plan.py": 701}
    assert forbidden_imports(root, P, "pkg.llvm", "pkg.targets") == {
        "pkg.llvm.emit": ["pkg.targets.cpu.kernels"]}
