"""docs/deployment.md: every setting and every Compose variable is documented, and the
documented torchrun launch of a plan across two hosts runs (both "hosts" on this one)."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipestudio.backend.settings import Settings
from tests.conftest import ROOT
from tests.deploy.compose import COMPOSE_FILE, DOCKERFILE

DOC = ROOT / "docs" / "deployment.md"
BIN = str(Path(sys.executable).parent)


def documented_variables() -> set[str]:
    """The first column of the configuration table."""
    return set(re.findall(r"^\| `([A-Z_]+)` \|", DOC.read_text(), re.M))


def test_every_setting_is_documented() -> None:
    settings = {f"PIPESTUDIO_{name.upper()}" for name in Settings.model_fields}
    assert settings <= documented_variables(), settings - documented_variables()


def test_every_compose_variable_is_documented() -> None:
    used = set(re.findall(r"\$\{(\w+)", COMPOSE_FILE.read_text()))
    used |= set(re.findall(r"^ARG (\w+)", DOCKERFILE.read_text(), re.M)) - {"TORCH_SPEC"}
    assert used <= documented_variables(), used - documented_variables()


def torchrun_commands() -> list[str]:
    block = DOC.read_text().split("### One plan across two hosts with torchrun")[1]
    text = re.search(r"```sh\n(.*?)```", block, re.S)[1]
    return [line for line in text.replace("\\\n", " ").splitlines() if line.startswith("torchrun")]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_torchrun_across_two_hosts(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    model = [
        "--model-arg",
        "layers=2",
        "--model-arg",
        "width=32",
        "--model-arg",
        "heads=2",
        "--model-arg",
        "seq_len=16",
        "--model-arg",
        "vocab=64",
    ]
    for argv in (
        [
            "pipestudio",
            "profile",
            "--model",
            "gpt",
            *model,
            "--microbatch-size",
            "2",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "-o",
            "profile.json",
        ],
        [
            "pipestudio",
            "plan-template",
            "profile.json",
            "--stages",
            "2",
            "--microbatches",
            "2",
            "--schedule",
            "1f1b",
            "-o",
            "plan.json",
        ],
    ):
        subprocess.run(argv, cwd=tmp_path, env=env, check=True, capture_output=True, timeout=120)
    commands = torchrun_commands()
    assert [re.search(r"--node-rank (\d)", c)[1] for c in commands] == ["0", "1"]
    port = str(free_port())
    hosts = []
    for idx, command in enumerate(commands):
        command = command.replace("HOST0", "127.0.0.1").replace("29400", port)
        command = (
            command.replace("--steps 100", "--steps 3").replace(
                "metrics.jsonl", f"metrics{idx}.jsonl"
            )
            + " "
            + " ".join(model)
        )
        hosts.append(
            subprocess.Popen(
                ["bash", "-c", command],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    outputs = [host.communicate(timeout=240)[0].decode(errors="replace") for host in hosts]
    for host, output in zip(hosts, outputs, strict=True):
        assert host.returncode == 0, output
    stages = []
    for idx in range(2):
        events = [json.loads(line) for line in (tmp_path / f"metrics{idx}.jsonl").open()]
        stages.append({e["stage"] for e in events if e.get("type") == "step"})
        assert [e["type"] for e in events].count("plan") == (idx == 0)  # rank 0 writes it
    assert stages == [{0}, {1}], "node rank 0 runs stage 0 and node rank 1 stage 1"


def test_the_documented_worker_container_runs_on_the_host_network() -> None:
    """The ``docker run`` of a worker on another machine: host networking (the ranks, the
    store and the link probe listen on ports picked at run time, at the host's address),
    the image's checkpoint path, and a worker command line the CLI accepts."""
    from pipestudio.cli import build_parser

    block = DOC.read_text().split("## Several machines with Docker")[1].split("\n## ")[0]
    runs = [
        line
        for text in re.findall(r"```sh\n(.*?)```", block, re.S)
        for line in text.replace("\\\n", " ").splitlines()
        if line.startswith("docker run")
    ]
    assert len(runs) == 1, runs
    words = runs[0].split()
    assert "--network" in words and words[words.index("--network") + 1] == "host"
    assert any(word.endswith(":/data/checkpoints") for word in words), words
    command = words[words.index("pipestudio", words.index("--network")) + 1 :]
    assert command[0] == "pipestudio" and command[1] == "worker", command
    options = build_parser().parse_args(command[1:])
    assert options.server == "http://HOST0:8000" and options.device == "cpu"
