"""docker-compose.yml and the Dockerfile: valid for Compose, and shaped as deployed.

``test_compose_cli_validates`` runs ``docker compose config`` (or ``docker-compose config``)
where a Compose client is installed and is skipped, saying so, where none is; the structure
is checked on the parsed file either way.
"""

import os
import re
import subprocess
from typing import Any

import pytest

from pipestudio.backend.settings import Settings
from tests.deploy.compose import (
    COMPOSE_FILE,
    DOCKERFILE,
    TOKENS,
    MissingVariableError,
    compose_cli,
    load,
)

SERVICES = {"postgres", "migrate", "backend", "worker-cpu-0", "worker-cpu-1", "worker-gpu"}
WORKERS = ("worker-cpu-0", "worker-cpu-1", "worker-gpu")
PIPESTUDIO_VARIABLES = {f"PIPESTUDIO_{name.upper()}" for name in Settings.model_fields}
#: What only workers read (``pipestudio worker``), not the backend.
WORKER_VARIABLES = {"PIPESTUDIO_ALLOWED_MODELS"}


@pytest.fixture
def services() -> dict[str, dict[str, Any]]:
    return dict(load(TOKENS)["services"])


def _clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIPESTUDIO_", "POSTGRES_", "TORCH_"))
    }


def test_compose_cli_validates() -> None:
    cli = compose_cli()
    if cli is None:
        pytest.skip(
            "no Compose client here (neither `docker compose` nor `docker-compose`): "
            "test_services_are_wired_as_deployed checks the parsed file instead"
        )
    for extra in ([], ["--profile", "gpu"]):
        done = subprocess.run(
            [*cli, "-f", str(COMPOSE_FILE), *extra, "config", "-q"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**_clean_env(), **TOKENS},
        )
        assert done.returncode == 0, f"{' '.join(cli)} config {extra}: {done.stderr}"
    done = subprocess.run(
        [*cli, "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(),
    )
    assert done.returncode != 0 and "PIPESTUDIO_" in done.stderr + done.stdout, (
        "the tokens must be required"
    )
    print(f"validated by `{' '.join(cli)} config`")


def test_tokens_are_required() -> None:
    with pytest.raises(MissingVariableError, match="PIPESTUDIO_API_TOKEN"):
        load({"PIPESTUDIO_WORKER_TOKEN": "w"})
    with pytest.raises(MissingVariableError, match="PIPESTUDIO_WORKER_TOKEN"):
        load({"PIPESTUDIO_API_TOKEN": "a"})


def test_services_are_wired_as_deployed(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == SERVICES
    postgres = services["postgres"]
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    migrate, backend = services["migrate"], services["backend"]
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert migrate["restart"] == "no"
    assert migrate["command"] == ["pipestudio", "db", "upgrade"]
    assert backend["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert backend["command"][:2] == ["pipestudio", "serve"]
    assert backend["environment"]["PIPESTUDIO_MIGRATE_ON_START"] == "false"
    assert backend["environment"]["PIPESTUDIO_API_TOKEN"] == "api-secret"
    assert backend["ports"] == ["127.0.0.1:8000:8000"] and "healthcheck" in backend
    for url in (
        backend["environment"]["PIPESTUDIO_DATABASE_URL"],
        migrate["environment"]["PIPESTUDIO_DATABASE_URL"],
    ):
        assert url == "postgresql://pipestudio:pipestudio@postgres:5432/pipestudio"
    for name in WORKERS:
        worker = services[name]
        assert worker["command"][:2] == ["pipestudio", "worker"], name
        assert "http://backend:8000" in worker["command"], name
        assert worker["environment"] == {
            "PIPESTUDIO_WORKER_TOKEN": "worker-secret",
            "PIPESTUDIO_ALLOWED_MODELS": None,
        }, name
        assert worker["depends_on"] == {"backend": {"condition": "service_healthy"}}, name


def test_gpu_worker_reserves_nvidia_devices(services: dict[str, dict[str, Any]]) -> None:
    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert "profiles" not in services["worker-cpu-0"]
    assert gpu["command"][gpu["command"].index("--device") + 1] == "cuda"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "whl/cu" in gpu["build"]["args"]["TORCH_INDEX_URL"]
    assert services["worker-cpu-0"]["build"]["args"]["TORCH_INDEX_URL"].endswith("/whl/cpu")


def test_configuration_is_only_environment(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        # named data volumes only (the database's, the checkpoints'), no files from the host
        for volume in service.get("volumes", []):
            assert volume.split(":")[0] in {"postgres-data", "checkpoints"}, (
                f"{name} mounts {volume}"
            )
        assert "env_file" not in service, name
        for variable in service.get("environment", {}):
            if variable in WORKER_VARIABLES:
                assert name in (*WORKERS, "worker-gpu"), f"{name} sets {variable}"
            elif variable.startswith("PIPESTUDIO_"):
                assert variable in PIPESTUDIO_VARIABLES, f"{name}: unknown setting {variable}"
            else:
                assert name == "postgres" and variable.startswith("POSTGRES_"), variable
    backend_settings = {v for v in services["backend"]["environment"]}
    assert backend_settings == PIPESTUDIO_VARIABLES, "every setting reaches the backend"


@pytest.mark.parametrize("path", [None, "/srv/checkpoints"])
def test_workers_share_the_checkpoints_where_the_backend_says(path: str | None) -> None:
    """Runs checkpoint and resume out of the box: every worker mounts one volume at the
    path the backend hands out (``PIPESTUDIO_CHECKPOINT_DIR``, by default the image's
    ``/data/checkpoints``, which belongs to the image's user)."""
    env = {**TOKENS, **({"PIPESTUDIO_CHECKPOINT_DIR": path} if path else {})}
    compose = load(env)
    services = compose["services"]
    where = services["backend"]["environment"]["PIPESTUDIO_CHECKPOINT_DIR"]
    assert where == (path or "/data/checkpoints")
    for name in WORKERS:
        assert services[name]["volumes"] == [f"checkpoints:{where}"], name
    assert "checkpoints" in compose["volumes"]
    assert "volumes" not in services["backend"] and "volumes" not in services["migrate"]
    assert re.search(
        r"mkdir -p /data/checkpoints\s*\\?\s*&& chown -R pipestudio /data", DOCKERFILE.read_text()
    )


def test_dockerfile_builds_the_image_the_services_use(services: dict[str, dict[str, Any]]) -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert re.search(r'pip install --index-url "\$\{TORCH_INDEX_URL\}"', text)
    assert ".[runtime,backend,dashboard]" in text
    assert re.search(r"^WORKDIR /app$", text, re.M)
    for name, service in services.items():
        if name != "postgres":
            assert service["build"]["context"] == ".", name
    # .dockerignore leaves out everything but what the Dockerfile copies
    kept = {
        line.strip("!/")
        for line in (COMPOSE_FILE.parent / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copied = {
        source.rstrip("/")
        for line in re.findall(r"^COPY (.+)$", text, re.M)
        for source in line.split()[:-1]
    }
    # ... which is the package root, every folder it links in, and the built-in profiles
    package = COMPOSE_FILE.parent / "src" / "pipestudio"
    linked = {path.readlink().name for path in package.iterdir() if path.is_symlink()}
    assert linked == {"backend", "runtime", "dashboard", "planner", "alembic"}
    assert (
        copied == kept == {"pyproject.toml", "README.md", "alembic.ini", "src", "profiles", *linked}
    )
