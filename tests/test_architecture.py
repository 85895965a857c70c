"""The package's structure: its folders are the pipeline's stages, each importing only from the stages
below it, and the code is clean for the linter.

Stages, from the ground up (docs/ARCHITECTURE.md draws the same): a module may import from its own
stage's modules and from any stage below, never from one above; an import inside a function counts
too, except those of an optional dependency (none of which is malinn's own).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the stages, lowest first: a module's stage is its folder's (or, at the package's top, its own name's)
STAGES = [
    {"errors", "version", "registry", "kernels"},  # kernels: the shipped kernel sources (data)
    {"environment", "resources", "io"},
    {"library"},
    {"backends"},
    {"choice"},
    {"ops"},
    {"plan"},
    {"layers", "tuning", "converters"},
    {"model"},
    {
        "cli",
        "serve",
        "ray",
        "__init__",
    },  # serve: malinn serve (starlette, uvicorn: the serve extra); ray: malinn.ray (the ray extra)
    {"__main__"},
]
FLOOR = {name: floor for floor, names in enumerate(STAGES) for name in names}


def stage(module: str) -> str:
    """``malinn.plan.builder`` -> ``plan``; ``malinn.ops`` -> ``ops``; ``malinn`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def modules() -> dict:
    """Every module of malinn/ and converters/ (as malinn.converters): ``{dotted name: path}``."""
    found = {}
    for folder, prefix in ((ROOT / "malinn", ["malinn"]), (ROOT / "converters", ["malinn", "converters"])):
        for path in folder.rglob("*.py"):
            parts = prefix + list(path.relative_to(folder).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path) -> set:
    """The malinn modules ``path`` (module ``name``) imports, relative imports resolved."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("malinn"):
                found.add(target)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("malinn")}
    return found


def test_every_module_has_a_stage():
    unknown = sorted({stage(name) for name in modules()} - set(FLOOR))
    assert not unknown, f"modules in folders with no stage (add them to STAGES and docs/ARCHITECTURE.md): {unknown}"


def test_no_module_imports_from_a_stage_above_its_own():
    upward = []
    for name, path in sorted(modules().items()):
        for target in sorted(imports(name, path)):
            if target in ("malinn", "malinn.__init__") and stage(name) not in ("__init__", "__main__"):
                upward.append(f"{name} imports the package itself")
            elif FLOOR[stage(target)] > FLOOR[stage(name)]:
                upward.append(f"{name} ({stage(name)}) imports {target} ({stage(target)})")
    assert not upward, "imports that climb back up a stage:\n" + "\n".join(upward)


def test_the_linter_finds_nothing():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode != 0 and "No module named ruff" in proc.stderr:
        pytest.fail("ruff is missing: pip install ruff (the test extra lists it)")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_formatter_changes_nothing():
    """Every Python file is as ``ruff format`` writes it (pyproject.toml's [tool.ruff])."""
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_type_check_finds_nothing():
    """mypy over the files pyproject.toml's [tool.mypy] names reports no error."""
    # no cache written into the checkout (--no-incremental alone still writes .mypy_cache/)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode != 0 and "No module named mypy" in proc.stderr:
        pytest.fail("mypy is missing: pip install mypy (the test extra lists it)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
