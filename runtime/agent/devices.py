"""What a worker advertises: its devices and how many ranks it takes."""

import os
from typing import Any, get_args

import torch

from pipestudio.runtime.engine.config import DeviceKind
from pipestudio.runtime.engine.network import route_address
from pipestudio.runtime.engine.rank import host_cores

DEVICE_KINDS: tuple[DeviceKind, ...] = get_args(DeviceKind)


class DeviceError(ValueError):
    """The devices asked for are not on this machine (``cuda`` without a usable GPU)."""


def local_devices(kind: str = "auto") -> list[dict[str, Any]]:
    """Every CUDA device (name, memory) for ``cuda``, the CPU (cores, memory) for ``cpu``;
    ``auto`` is ``cuda`` when a GPU is usable, else ``cpu``. ``cuda`` on a machine without
    one raises ``DeviceError``: a GPU worker must never quietly train on the CPU."""
    if kind not in DEVICE_KINDS:
        raise DeviceError(f"device kind {kind!r}: expected one of {', '.join(DEVICE_KINDS)}")
    if kind == "cuda" and not torch.cuda.is_available():
        built = (
            f"torch {torch.__version__} built with CUDA {torch.version.cuda}"
            if torch.version.cuda
            else f"torch {torch.__version__} built without CUDA"
        )
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            built += f", CUDA_VISIBLE_DEVICES={visible!r}"
        raise DeviceError(
            f"--device cuda: no usable CUDA device on this machine ({built}); "
            "use --device cpu, or --device auto (the GPUs when there are any, "
            "else the CPU)"
        )
    if kind != "cpu" and torch.cuda.is_available():
        return [
            {
                "kind": "cuda",
                "index": idx,
                "name": torch.cuda.get_device_name(idx),
                "memory_bytes": torch.cuda.get_device_properties(idx).total_memory,
            }
            for idx in range(torch.cuda.device_count())
        ]
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = None
    cores = host_cores()
    return [
        {
            "kind": "cpu",
            "index": 0,
            "name": f"cpu ({cores} cores)",
            "cores": cores,
            "memory_bytes": memory,
        }
    ]


def reachable_address(server_url: str) -> str:
    """This machine's address on the route to the server (what peers should dial)."""
    host = server_url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    return route_address(host)
