"""README.md as a newcomer uses it: every ``pipestudio`` command it shows exists, takes the
options the README gives it (checked against its ``--help``), and its shell sessions run
verbatim."""

import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import ROOT

README = ROOT / "README.md"
BIN = str(Path(sys.executable).parent)
_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def code_blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block."""
    return [(m[1], m[2]) for m in _BLOCK.finditer(README.read_text())]


def commands() -> list[str]:
    """Every ``pipestudio ...`` command line in a block, continuation lines joined."""
    found: list[str] = []
    for _, text in code_blocks():
        current: list[str] | None = None
        for line in text.splitlines():
            bare = line.removeprefix("$ ")
            if bare.startswith("pipestudio "):
                current = [bare.split("#")[0]]
                found.append("")
            elif current is not None and line[:1].isspace():
                current.append(line.split("#")[0])
            else:
                current = None
            if current is not None:
                found[-1] = " ".join(part.strip().rstrip("\\") for part in current)
    return found


def options_of(line: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*|-o)\b", line))


@cache
def help_text(command: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "pipestudio", command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    return done.returncode, done.stdout + done.stderr


def test_the_readme_shows_commands() -> None:
    names = {line.split()[1] for line in commands()}
    assert {
        "import-pipedream",
        "simulate",
        "plan",
        "profile",
        "train",
        "serve",
        "worker",
    } <= names, names


@pytest.mark.parametrize("line", commands(), ids=lambda line: " ".join(line.split()[:2]))
def test_command_exists_and_takes_its_options(line: str) -> None:
    command = line.split()[1]
    status, text = help_text(command)
    assert status == 0, f"`pipestudio {command} --help` failed:\n{text}"
    missing = sorted(o for o in options_of(line) if not re.search(rf"{o}\b", text))
    assert not missing, f"README: `{line}`\n`pipestudio {command} --help` has no {missing}"


def runnable_sessions() -> list[str]:
    """Shell blocks made only of pipestudio commands (the others start services or make)."""
    blocks = []
    for language, text in code_blocks():
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
        starts = [ln for ln in lines if not ln[:1].isspace()]
        only_pipestudio = starts and all(ln.startswith("pipestudio ") for ln in starts)
        starts_services = any(word in text for word in (" serve", " worker", " train "))
        if language == "sh" and only_pipestudio and not starts_services:
            blocks.append(text)
    return blocks


@pytest.mark.parametrize("script", runnable_sessions(), ids=lambda s: s.split()[1])
def test_shell_session_runs_verbatim(script: str, tmp_path: Path) -> None:
    (tmp_path / "profiles").symlink_to(ROOT / "profiles")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
    )
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
