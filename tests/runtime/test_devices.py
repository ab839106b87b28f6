"""Device names resolve to devices that exist (devices.py)."""

import pytest
import torch

from pipestudio.runtime.devices import describe_device, resolve_device
from pipestudio.runtime.errors import DeviceError


def test_cpu_is_always_there() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert describe_device(torch.device("cpu")).startswith("cpu (")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
def test_cuda_gets_an_index() -> None:
    assert resolve_device("cuda") == torch.device("cuda", torch.cuda.current_device())
    with pytest.raises(DeviceError, match="does not exist"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")
