"""The dependency rules of DESIGN.md section 2, checked on the source.

spec/ may import the standard library and NumPy; runtime/ may import spec/ only (never the
compiler, never onnx): a deployment host installs the runtime alone. And each distribution
(mlpack-runtime, runtime/pyproject.toml; mlpack, pyproject.toml) declares every third-party
module its shipped code imports, so either installed alone without extras works.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "spec": {"onnx", "onnxruntime", "llvmlite", "typer", "codegen", "packager", "runtime"},
    "runtime": {"onnx", "onnxruntime", "llvmlite", "typer", "codegen", "packager"},
}


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            parts = mod.split(".")
            if node.level == 0:
                names.add(parts[0])
                if parts[0] == "mlpack" and len(parts) > 1:
                    names.add(parts[1])
            else:
                # a relative import that climbs out of its folder names a sibling subpackage
                names.update(p for p in parts if p)
    return names


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_folder_imports_only_what_it_may(folder):
    bad = {}
    for path in (ROOT / folder).rglob("*.py"):
        hit = _imports(path) & FORBIDDEN[folder]
        if hit:
            bad[str(path.relative_to(ROOT))] = sorted(hit)
    assert not bad, f"{folder}/ imports what it may not: {bad}"


# ---------------------------------------------------------------- what each distribution declares

# the folders each distribution ships (runtime/pyproject.toml, pyproject.toml); build scripts aside
SHIPPED = {"runtime/pyproject.toml": ["spec", "runtime", "mlpack/__init__.py"],
           "pyproject.toml": ["codegen", "packager", "mlpack/backend.py", "mlpack/conformance.py"]}
BUILD_SCRIPTS = {"setup.py"}


def _guarded(tree: ast.AST) -> set[int]:
    """Line numbers of imports inside ``try: ... except ImportError`` (optional modules)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers if h.type is not None for n in ast.walk(h.type)):
            lines.update(n.lineno for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno"))
    return lines


def _third_party_needs(path: pathlib.Path) -> set[str]:
    """Top-level modules a file imports unguarded, or runs with ``python -m``, outside the stdlib."""
    import re
    import sys

    text = path.read_text()
    tree = ast.parse(text, str(path))
    optional = _guarded(tree)
    names = set(re.findall(r'"-m",\s*"(\w+)"', text))
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in optional:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "mlpack"}


@pytest.mark.parametrize("project", sorted(SHIPPED))
def test_distribution_declares_what_its_code_imports(project):
    """`pip install` of either distribution alone gives code whose imports resolve (issue: an
    `mlpack build` that failed on a missing onnxruntime, a test extra then)."""
    import importlib.metadata
    import re
    import tomllib

    declared = {re.split(r"[<>=!~ \[;]", d)[0].lower().replace("_", "-")
                for d in tomllib.loads((ROOT / project).read_text())["project"]["dependencies"]}
    files = []
    for entry in SHIPPED[project]:
        p = ROOT / entry
        files += [f for f in p.rglob("*.py") if "build" not in f.relative_to(ROOT).parts] if p.is_dir() else [p]
    dists = importlib.metadata.packages_distributions()
    missing = {}
    for f in files:
        if f.name in BUILD_SCRIPTS:
            continue
        for module in _third_party_needs(f):
            names = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
            if not names & declared:
                missing.setdefault(module, []).append(str(f.relative_to(ROOT)))
    assert not missing, f"{project} does not declare what its code imports: {missing}"


@pytest.mark.parametrize("folder", ["mlpack", "spec", "codegen", "packager", "runtime"])
def test_imports_are_absolute(folder):
    """``from mlpack.spec.ir import dtypes``, never ``from ...spec.ir import dtypes``: a reader
    (and grep) sees where a name comes from without counting dots."""
    relative = []
    for path in (ROOT / folder).rglob("*.py"):
        if "build" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                relative.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not relative, f"relative imports: {relative}"
