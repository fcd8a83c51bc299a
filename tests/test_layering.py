"""The dependency rules of DESIGN.md section 2, checked on the source.

spec/ may import the standard library and NumPy; runtime/ may import spec/ only (never the
compiler, never onnx): a deployment host installs the runtime alone.
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
