"""What ``pipestudio worker --device`` advertises (runtime/agent/devices.py):
``cuda`` where no GPU is usable is refused, never quietly replaced by the CPU."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

torch = pytest.importorskip("torch")

from pipestudio.cli import main  # noqa: E402
from pipestudio.runtime.agent.devices import DeviceError, local_devices  # noqa: E402


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.usefixtures("no_gpu")
def test_cuda_without_a_gpu_is_refused() -> None:
    with pytest.raises(DeviceError, match="--device cuda: no usable CUDA device"):
        local_devices("cuda")
    assert [d["kind"] for d in local_devices("auto")] == ["cpu"]
    assert [d["kind"] for d in local_devices("cpu")] == ["cpu"]
    with pytest.raises(DeviceError, match="'tpu'"):
        local_devices("tpu")


@pytest.mark.usefixtures("no_gpu")
def test_worker_cuda_without_a_gpu_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    # port 9 (discard): the worker must stop before it dials anything
    assert (
        main(["worker", "--server", "http://127.0.0.1:9", "--token", "t", "--device", "cuda"]) == 2
    )
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: --device cuda: no usable CUDA device on this machine")
    assert "--device cpu" in err


def test_worker_process_with_no_visible_gpu_exits_2() -> None:
    """The command as deployed, with every GPU hidden (so also on a GPU machine)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipestudio",
            "worker",
            "--server",
            "http://127.0.0.1:9",
            "--token",
            "t",
            "--device",
            "cuda",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no usable CUDA device" in done.stderr and "Traceback" not in done.stderr
    assert "CUDA_VISIBLE_DEVICES=''" in done.stderr
    assert "serving" not in done.stdout, "it must not register"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_devices_are_advertised_where_there_are() -> None:
    devices = local_devices("cuda")
    assert [d["index"] for d in devices] == list(range(torch.cuda.device_count()))
    assert all(d["kind"] == "cuda" and d["memory_bytes"] > 0 for d in devices)
    assert local_devices("auto") == devices
