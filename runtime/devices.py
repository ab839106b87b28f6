"""Choosing and naming the device a runtime process computes on."""

import torch

from pipestudio.runtime.errors import DeviceError


def resolve_device(name: str | torch.device) -> torch.device:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"`` as a torch.device that exists on this machine."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DeviceError(
            f"device {str(name)!r} is not understood; expected cpu, cuda or cuda:N"
        ) from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise DeviceError(f"device {str(name)!r} is not supported; expected cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise DeviceError(
            f"device {str(name)!r} was requested but CUDA is not available "
            f"(torch {torch.__version__})"
        )
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise DeviceError(
            f"device {str(name)!r} does not exist; this machine has "
            f"{torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device("cuda", index)


def describe_device(device: torch.device) -> str:
    """A readable name for profiles and logs: the GPU model, or the CPU thread count."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} ({device})"
    threads = torch.get_num_threads()
    return f"cpu ({threads} thread{'' if threads == 1 else 's'})"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a host-side clock or memory reading is true."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
