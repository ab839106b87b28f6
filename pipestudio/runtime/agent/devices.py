"""What a worker advertises: its devices and how many ranks it takes."""

import os
import socket
from typing import Any

import torch


def local_devices(kind: str = "auto") -> list[dict[str, Any]]:
    """Every CUDA device (name, memory), or the CPU (cores, memory) when there is none or
    ``kind`` is ``cpu``."""
    if kind != "cpu" and torch.cuda.is_available():
        return [{"kind": "cuda", "index": idx, "name": torch.cuda.get_device_name(idx),
                 "memory_bytes": torch.cuda.get_device_properties(idx).total_memory}
                for idx in range(torch.cuda.device_count())]
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = None
    return [{"kind": "cpu", "index": 0, "name": f"cpu ({os.cpu_count()} cores)",
             "memory_bytes": memory}]


def reachable_address(server_url: str) -> str:
    """This machine's address on the route to the server (what peers should dial)."""
    host = server_url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(host), 9))
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())
