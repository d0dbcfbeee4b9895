"""The .pyi stubs describe the native module as it is, and every public Python API has a
docstring."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Dict, Set

import sluice
from sluice import _sluice

STUB = Path(sluice.__file__).with_name("_sluice.pyi")


def stub_names() -> Dict[str, Set[str]]:
    """Top-level names of the stub, and for each class the names it declares."""
    tree = ast.parse(STUB.read_text())
    out: Dict[str, Set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            out[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = set()
    return out


def public(obj: object) -> Set[str]:
    return {n for n in dir(obj) if not n.startswith("_") or n in ("__next__", "__iter__", "__version__")}


def test_stub_matches_the_native_module() -> None:
    stubs = stub_names()
    assert set(stubs) == public(_sluice)
    for name, members in stubs.items():
        obj = getattr(_sluice, name)
        if inspect.isclass(obj):
            assert members - {"__new__"} == public(obj), name


def test_every_public_python_api_has_a_docstring() -> None:
    import sluice.torch

    missing = []
    for module in (sluice, sluice.torch, sluice.errors):
        assert module.__doc__
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not inspect.getdoc(obj):
                missing.append(f"{module.__name__}.{name}")
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not (
                        inspect.isfunction(member) or isinstance(member, (property, classmethod))
                    ):
                        continue
                    if not inspect.getdoc(getattr(obj, attr)):
                        missing.append(f"{module.__name__}.{name}.{attr}")
    assert missing == []
