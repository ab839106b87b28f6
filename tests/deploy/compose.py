"""Reading docker-compose.yml as Compose does: YAML, then ``${VAR}`` interpolation."""

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT

COMPOSE_FILE = ROOT / "docker-compose.yml"
#: The two required variables, as a deployment sets them.
TOKENS = {"PIPESTUDIO_API_TOKEN": "api-secret", "PIPESTUDIO_WORKER_TOKEN": "worker-secret"}
DOCKERFILE = ROOT / "Dockerfile"
#: ``$$``, ``${NAME}``, ``${NAME:-default}``, ``${NAME-default}``, ``${NAME:?error}``...
_VARIABLE = re.compile(r"\$(?:(?P<dollar>\$)|\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})")


class MissingVariableError(ValueError):
    """A ``${NAME:?message}`` whose variable is not set."""


def interpolate(text: str, env: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match["dollar"]:
            return "$"
        name, op, arg = match["name"], match["op"] or "", match["arg"] or ""
        value = env.get(name)
        missing = value is None or (op.startswith(":") and value == "")
        if missing and op.endswith("?"):
            raise MissingVariableError(f"{name}: {arg or 'required'}")
        if missing and op.endswith("-"):
            return arg
        return value or ""

    return _VARIABLE.sub(replace, text)


def resolve(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [resolve(item, env) for item in node]
    if isinstance(node, dict):
        return {key: resolve(value, env) for key, value in node.items()}
    return node


def load(env: Mapping[str, str], path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose file with variables from ``env``, as ``docker compose config`` reads it
    (``x-`` extension keys and YAML merge keys included)."""
    return dict(resolve(yaml.safe_load(path.read_text()), env))


def compose_cli() -> list[str] | None:
    """``docker compose`` (the plugin) or ``docker-compose``, whichever works here."""
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for argv in candidates:
        try:
            done = subprocess.run(
                [*argv, "version"],
                capture_output=True,
                timeout=30,
                env={**os.environ, "DOCKER_CLI_HINTS": "false"},
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return argv
    return None
