"""The layout and the package: the code's top-level folders are the package `pipestudio`
in a checkout (an editable install) and in a wheel (docs/architecture.md)."""

import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "pipestudio"
#: The top-level folders the package links in, by the name they have inside it.
LINKED = {
    "backend": "backend",
    "runtime": "runtime",
    "dashboard": "dashboard",
    "planner": "planner",
    "migrations": "alembic",
}


def packaged_files() -> set[str]:
    """Every file the package must carry, as a path inside the package: the modules of its
    root and of every linked folder, the migrations, the dashboard's assets, py.typed."""
    names = {"py.typed"}
    for path in PACKAGE.rglob("*.py"):
        names.add(str(path.relative_to(PACKAGE)))
    for name, folder in LINKED.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                names.add(f"{name}/{path.relative_to(ROOT / folder)}")
    return names


def test_the_top_level_holds_the_code_and_the_package_links_it() -> None:
    top = {path.name for path in ROOT.iterdir()}
    assert {
        "pyproject.toml",
        "backend",
        "runtime",
        "dashboard",
        "planner",
        "tests",
        "alembic",
        "alembic.ini",
        "docker-compose.yml",
        "README.md",
        "src",
    } <= top
    # a pipestudio/ folder at the root would shadow the installed package
    assert "pipestudio" not in top
    links = {path.name: path.readlink() for path in PACKAGE.iterdir() if path.is_symlink()}
    assert links == {name: Path("..", "..", folder) for name, folder in LINKED.items()}
    # an alembic/ package would shadow the Alembic library for code run from the root
    assert not (ROOT / "alembic" / "__init__.py").exists()


def test_every_folder_of_code_is_a_package_the_wheel_finds() -> None:
    """setuptools packages a folder of modules only when it has an ``__init__.py``."""
    missing = sorted(
        str(folder.relative_to(ROOT))
        for name, top in LINKED.items()
        if name != "migrations"
        for folder in [ROOT / top, *(ROOT / top).rglob("*")]
        if folder.is_dir()
        and folder.name not in {"__pycache__", "assets"}
        and any(folder.glob("*.py"))
        and not (folder / "__init__.py").exists()
    )
    assert not missing, f"folders of modules without __init__.py: {missing}"


@pytest.mark.slow
def test_the_wheel_holds_every_module_migration_and_asset(tmp_path: Path) -> None:
    # from a copy of the sources, so that no build/ folder is left in (or read from) the root
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        symlinks=True,
        ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__"),
    )
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    (wheel,) = tmp_path.glob("pipestudio-*.whl")
    inside = {
        name.removeprefix("pipestudio/")
        for name in zipfile.ZipFile(wheel).namelist()
        if name.startswith("pipestudio/")
    }
    expected = packaged_files()
    assert "migrations/versions/0001_initial.py" in expected
    assert "dashboard/assets/pipestudio.css" in expected
    assert not expected - inside, f"left out of the wheel: {sorted(expected - inside)}"
    # and nothing lands beside the package (no top-level `backend` module in site-packages)
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {
        "pipestudio",
        wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info",
    }


def test_the_package_imports_from_any_directory(tmp_path: Path) -> None:
    code = (
        "import pipestudio.backend, pipestudio.runtime, pipestudio.dashboard, "
        "pipestudio.planner, pipestudio.backend.migrate as m; "
        "print(pipestudio.planner.__file__); print(m.MIGRATIONS.is_dir())"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path
    )
    assert completed.returncode == 0, completed.stderr
    where, migrations = completed.stdout.split()
    assert Path(where).resolve() == ROOT / "planner" / "__init__.py"
    assert migrations == "True"


def test_a_new_module_imports_without_reinstalling(tmp_path: Path) -> None:
    name = f"_probe_{uuid.uuid4().hex[:8]}"
    module = ROOT / "planner" / f"{name}.py"
    module.write_text("ANSWER = 42\n")
    try:
        completed = subprocess.run(
            [sys.executable, "-c", f"from pipestudio.planner.{name} import ANSWER; print(ANSWER)"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
    finally:
        module.unlink()
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "42"


def test_pre_commit_runs_what_make_lint_runs() -> None:
    """The hooks and ``make lint`` name the same tools with the same arguments (the hooks
    are handed the changed files, ``make lint`` the code's folders)."""
    import yaml

    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [
        hook["entry"].replace(".venv/bin/", "")
        for repo in config["repos"]
        for hook in repo["hooks"]
    ]
    makefile = (ROOT / "Makefile").read_text()
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    commands = [
        line.strip().replace("$(VENV)/bin/", "").replace(" $(CODE)", "")
        for line in lint.splitlines()[1:]
    ]
    assert hooks == commands == ["ruff check", "ruff format --check", "mypy"]
    # and make lint checks every folder that holds Python
    code = makefile.split("CODE :=", 1)[1].split("\n", 1)[0].split()
    folders = {
        top.name
        for top in ROOT.iterdir()
        if top.is_dir()
        and not top.name.startswith(".")
        and top.name not in {"build", "dist"}
        and any(top.rglob("*.py"))
    }
    assert folders <= set(code), sorted(folders - set(code))
