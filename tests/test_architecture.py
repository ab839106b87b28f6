"""The direction of dependencies between the components (docs/architecture.md)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

WEB_AND_DB = {
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "dash",
    "plotly",
    "flask",
    "httpx",
    "requests",
    "websockets",
    "psycopg",
    "psycopg2",
    "aiosqlite",
}
FORBIDDEN = {
    "planner": WEB_AND_DB
    | {
        "torch",
        "pipestudio.runtime",
        "pipestudio.backend",
        "pipestudio.dashboard",
        "pipestudio.cli",
    },
    "runtime": {
        "pipestudio.backend",
        "pipestudio.dashboard",
        "dash",
        "sqlalchemy",
        "alembic",
        "fastapi",
    },
    "backend": {"torch", "pipestudio.runtime", "pipestudio.dashboard", "dash"},
    "dashboard": {
        "torch",
        "pipestudio.runtime",
        "pipestudio.backend",
        "sqlalchemy",
        "alembic",
        "fastapi",
    },
}


def imported_modules(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def violations(source: str, forbidden: set[str]) -> set[str]:
    return {
        name
        for name in imported_modules(source)
        for bad in forbidden
        if name == bad or name.startswith(bad + ".")
    }


def test_scanner_sees_forbidden_imports() -> None:
    source = "import torch.nn as nn\nfrom pipestudio.backend.app import x\nimport json\n"
    assert violations(source, FORBIDDEN["planner"]) == {"torch.nn", "pipestudio.backend.app"}


@pytest.mark.parametrize("component", sorted(FORBIDDEN))
def test_component_imports_only_what_it_may(component: str) -> None:
    files = sorted((ROOT / component).rglob("*.py"))
    assert files, f"{component}/ has no modules"
    found = {
        str(path.relative_to(ROOT)): bad
        for path in files
        if (bad := violations(path.read_text(), FORBIDDEN[component]))
    }
    assert not found, f"forbidden imports: {found}"


def test_planner_loads_without_torch_or_web_packages() -> None:
    """Transitive check: importing the planner pulls in none of them."""
    forbidden = sorted(WEB_AND_DB | {"torch"})
    code = (
        "import sys, pipestudio.planner, pipestudio.cli; "
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {forbidden!r}); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_no_module_imports_a_folder_by_its_bare_name() -> None:
    """pytest puts the root on ``sys.path``, so ``import planner`` would load a second copy
    of ``pipestudio.planner`` (two sets of classes, two registries): always the full name."""
    bare = {"backend", "runtime", "dashboard", "planner", "cli"}
    found = {}
    for folder in ["src", *sorted(FORBIDDEN), "tests", "bench", "alembic"]:
        for path in (ROOT / folder).rglob("*.py"):
            if names := {
                name for name in imported_modules(path.read_text()) if name.split(".")[0] in bare
            }:
                found[str(path.relative_to(ROOT))] = names
    assert not found, f"bare imports: {found}"


@pytest.mark.parametrize("top", ["planner", "runtime/engine"])
def test_each_package_docstring_lists_what_it_holds(top: str) -> None:
    """A reader opening a package's ``__init__`` finds every module and subpackage in it
    named (``name``, ``name/`` or ``name.py``)."""
    missing = {}
    for init in sorted((ROOT / top).rglob("__init__.py")):
        folder = init.parent
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        names = {path.stem for path in folder.glob("*.py") if path.name != "__init__.py"}
        names |= {path.name for path in folder.iterdir() if (path / "__init__.py").exists()}
        unnamed = sorted(
            name
            for name in names
            if not any(f"``{name}{end}``" in docstring for end in ("", "/", ".py"))
        )
        if unnamed:
            missing[str(folder.relative_to(ROOT))] = unnamed
    assert not missing, f"modules their package's docstring does not name: {missing}"


@pytest.mark.parametrize("top", ["planner", "runtime/engine"])
def test_tests_mirror_the_source_folders(top: str) -> None:
    """tests/planner/simulator/ tests planner/simulator/, and so on: every folder of tests
    has its source folder, and every source package with modules has a folder of tests."""
    tests_top = ROOT / "tests" / top
    tested = {path.parent.relative_to(tests_top) for path in tests_top.rglob("test_*.py")}
    sources = {
        path.parent.relative_to(ROOT / top)
        for path in (ROOT / top).rglob("__init__.py")
        if any(p.name != "__init__.py" for p in path.parent.glob("*.py"))
    }
    assert tested <= sources, f"tests without a source folder: {sorted(map(str, tested - sources))}"
    assert sources <= tested, f"source folders without tests: {sorted(map(str, sources - tested))}"
