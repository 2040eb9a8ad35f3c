"""The layout of the Python package (docs/architecture.md, "The Python layer"): strata.torch
in two wings joined by one public seam, small modules, a package __init__ that re-exports.

Counted from the sources with ``ast`` (no import of strata needed):

* a *cross-wing private read* is an attribute access ``x._name`` (``x`` not ``self`` /
  ``cls``) in one wing whose ``_name`` is defined (a def, a class, an assignment, a
  ``self._name =``) only in the other wing;
* a *private import* is an import of the other wing's underscore modules (the optimizer
  wing may import ``strata.torch.offload``'s package names only; the offload wing nothing
  of the optimizer wing).
"""
import ast
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PKG = os.path.join(ROOT, "bindings", "python", "strata")
WINGS = {"optim": os.path.join(PKG, "torch", "optim"),
         "offload": os.path.join(PKG, "torch", "offload")}


def _modules(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py"))


def _tree(path):
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def _defined_private(paths):
    """Underscore names a set of modules defines (not dunders)."""
    names = set()
    for path in paths:
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _private_reads(path):
    """(line, attribute) of every ``x._name`` with x not self/cls."""
    out = []
    for node in ast.walk(_tree(path)):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            out.append((node.lineno, node.attr))
    return out


def _imports(path):
    """(level, module, names) of every import of a module."""
    out = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or "", [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((0, a.name, []) for a in node.names)
    return out


def test_no_private_reads_between_the_wings():
    defined = {w: _defined_private(_modules(d)) for w, d in WINGS.items()}
    found = []
    for wing, other in (("optim", "offload"), ("offload", "optim")):
        only_other = defined[other] - defined[wing]
        for path in _modules(WINGS[wing]):
            for line, attr in _private_reads(path):
                if attr in only_other:
                    found.append(f"{os.path.relpath(path, PKG)}:{line}: .{attr}")
    assert found == []


def test_wings_import_only_the_seam():
    bad = []
    for path in _modules(WINGS["optim"]):
        for level, module, names in _imports(path):
            if (level == 2 and module.startswith("offload.")) or "torch.offload._" in module:
                bad.append(f"{os.path.basename(path)}: from {'.' * level}{module}")
    for path in _modules(WINGS["offload"]):
        for level, module, names in _imports(path):
            if (level == 2 and module.split(".")[0] == "optim") or "torch.optim" in module:
                bad.append(f"{os.path.basename(path)}: from {'.' * level}{module}")
    assert bad == []


def _sources_outside_the_offload_wing():
    roots = [PKG, os.path.join(ROOT, "tests"), os.path.join(ROOT, "examples"),
             os.path.join(ROOT, "bench")]
    for root in roots:
        for d, _, files in os.walk(root):
            if os.path.abspath(d).startswith(os.path.abspath(WINGS["offload"])):
                continue
            for f in files:
                if f.endswith(".py") and f != os.path.basename(__file__):
                    yield os.path.join(d, f)


def test_parameter_attributes_only_in_the_offload_wing():
    found = []
    for path in _sources_outside_the_offload_wing():
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if re.search(r"_strata_(slot|owner|record)\b", line):
                    found.append(f"{os.path.relpath(path, ROOT)}:{i}")
    assert found == []


def _py_files(root):
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                yield os.path.join(d, f)


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def test_package_init_only_re_exports_and_modules_stay_small():
    assert _lines(os.path.join(PKG, "__init__.py")) < 100
    big = {os.path.relpath(p, PKG): _lines(p) for p in _py_files(PKG) if _lines(p) > 500}
    assert big == {}


@pytest.mark.parametrize("wing", sorted(WINGS))
def test_every_module_says_its_role(wing):
    undocumented = [os.path.basename(p) for p in _modules(WINGS[wing])
                    if not ast.get_docstring(_tree(p))]
    assert undocumented == []
