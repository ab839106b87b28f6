"""The Cluster format: devices, their memory, and the levels of links that connect them.

Levels follow PipeDream (SOSP'19 §3.1): level 0 groups ``size`` devices that talk over links
of ``bandwidth_gbps``; level k groups ``size`` groups of level k-1. Devices are numbered so
that each group is a contiguous range, so two devices talk over the innermost level whose
group holds both. Each device also has a link to host memory, used by swap.
"""

import math
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from pipestudio.planner.errors import ClusterError
from pipestudio.planner.formats.documents import (
    MAX_BYTES,
    MAX_DEVICES,
    MAX_GBPS,
    MAX_LEVEL_SIZE,
    MAX_LEVELS,
    MAX_NAME_CHARS,
    STRICT,
    Bytes,
    Document,
    Gbps,
    LevelSize,
    Name,
)


class Level(BaseModel):
    """One level of the hierarchy (innermost first)."""

    model_config = STRICT

    name: Name = Field("", description="Name of the group at this level, e.g. server, rack.")
    size: LevelSize = Field(description="Number of members (devices or lower groups) per group.")
    bandwidth_gbps: Gbps | None = Field(
        description="Bandwidth of a link between two members; null = free (no transfer time)."
    )


class Device(BaseModel):
    """One accelerator and its link to host memory."""

    model_config = STRICT

    name: Name = Field(min_length=1)
    memory_bytes: Bytes | None = Field(None, ge=1, description="Device memory; null = unlimited.")
    host_to_device_gbps: Gbps | None = Field(None, description="Swap-in bandwidth; null = free.")
    device_to_host_gbps: Gbps | None = Field(None, description="Swap-out bandwidth; null = free.")
    staging_gbps: Gbps | None = Field(
        None,
        description="Between two processes that share this device: the hop through "
        "host memory from one to the other (gloo on the host); null = free.",
    )


class Cluster(Document):
    """Devices and the hierarchy of links between them."""

    format: Literal["pipestudio.cluster"] = "pipestudio.cluster"
    version: Literal[1] = 1
    name: Name = "cluster"
    levels: list[Level] = Field(
        min_length=1, max_length=MAX_LEVELS, description="Innermost level first."
    )
    devices: list[Device] = Field(min_length=1, max_length=MAX_DEVICES)

    @model_validator(mode="after")
    def _check_sizes(self) -> "Cluster":
        expected = math.prod(level.size for level in self.levels)
        if expected != len(self.devices):
            sizes = " x ".join(str(level.size) for level in self.levels)
            raise ValueError(
                f"the levels ({sizes}) hold {expected} devices but {len(self.devices)} are listed"
            )
        names = [device.name for device in self.devices]
        if len(set(names)) != len(names):
            duplicate = next(name for name in names if names.count(name) > 1)
            raise ValueError(f"duplicate device name {duplicate!r}")
        return self

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def level_between(self, device_a: int, device_b: int) -> int:
        """Index of the innermost level whose group holds both devices (-1: same device)."""
        if device_a == device_b:
            return -1
        group_size = 1
        for level_idx, level in enumerate(self.levels):
            group_size *= level.size
            if device_a // group_size == device_b // group_size:
                return level_idx
        raise AssertionError("every device pair shares the outermost level")

    def bandwidth_gbps(self, device_a: int, device_b: int) -> float | None:
        """Bandwidth between two devices; ``None`` means free: the same device, or a level
        without a bandwidth."""
        level_idx = self.level_between(device_a, device_b)
        return None if level_idx < 0 else self.levels[level_idx].bandwidth_gbps

    def slowest_bandwidth_gbps(self, device_indices: Iterable[int]) -> float | None:
        """The least bandwidth between two of the devices (``None``: every pair is free).

        Found level by level, not pair by pair, so that an all-reduce over thousands of
        replicas costs no more than their number: a level links two of the devices when
        one of its groups holds devices of two different groups of the level below.
        """
        devices = set(device_indices)
        slowest: float | None = None
        inner = 1  # size of a group of the level below; 1: a device
        for level in self.levels:
            outer = inner * level.size
            if level.bandwidth_gbps is not None and _links_two_groups(devices, inner, outer):
                slowest = min(slowest or math.inf, level.bandwidth_gbps)
            inner = outer
        return slowest

    def check_device(self, device_idx: int) -> None:
        if not 0 <= device_idx < len(self.devices):
            raise ClusterError(
                f"device {device_idx} does not exist: the cluster has {len(self.devices)} "
                f"devices (0..{len(self.devices) - 1})"
            )


def _links_two_groups(devices: set[int], inner: int, outer: int) -> bool:
    first_inner: dict[int, int] = {}
    for device in devices:
        if first_inner.setdefault(device // outer, device // inner) != device // inner:
            return True
    return False


def cluster_template(
    devices_per_level: list[int],
    bandwidths_gbps: list[float | None],
    *,
    device_memory_bytes: int | None = None,
    host_bandwidth_gbps: float | None = None,
    name: str = "cluster",
) -> Cluster:
    """A homogeneous cluster: ``devices_per_level`` and ``bandwidths_gbps`` innermost first."""
    _check_template(
        devices_per_level, bandwidths_gbps, device_memory_bytes, host_bandwidth_gbps, name
    )
    levels = [
        Level(name=f"level{idx}", size=size, bandwidth_gbps=bandwidth)
        for idx, (size, bandwidth) in enumerate(
            zip(devices_per_level, bandwidths_gbps, strict=True)
        )
    ]
    count = math.prod(devices_per_level)
    devices = [
        Device(
            name=f"device{idx}",
            memory_bytes=device_memory_bytes,
            host_to_device_gbps=host_bandwidth_gbps,
            device_to_host_gbps=host_bandwidth_gbps,
        )
        for idx in range(count)
    ]
    return Cluster(name=name, levels=levels, devices=devices)


def _check_template(
    devices_per_level: list[int],
    bandwidths_gbps: list[float | None],
    device_memory_bytes: int | None,
    host_bandwidth_gbps: float | None,
    name: str,
) -> None:
    """The Cluster document's limits, checked before a device list is built."""
    if len(devices_per_level) != len(bandwidths_gbps):
        raise ClusterError(
            f"{len(devices_per_level)} level sizes ({devices_per_level}) but "
            f"{len(bandwidths_gbps)} bandwidths ({bandwidths_gbps}): give one bandwidth per level"
        )
    if not 1 <= len(devices_per_level) <= MAX_LEVELS:
        raise ClusterError(f"a cluster has 1 to {MAX_LEVELS} levels, got {len(devices_per_level)}")
    for size in devices_per_level:
        if not 1 <= size <= MAX_LEVEL_SIZE:
            raise ClusterError(f"a level size must be between 1 and {MAX_LEVEL_SIZE}, got {size}")
    count = math.prod(devices_per_level)
    if count > MAX_DEVICES:
        raise ClusterError(
            f"levels of {' x '.join(map(str, devices_per_level))} devices hold "
            f"{count} devices, more than the limit of {MAX_DEVICES}"
        )
    for bandwidth in bandwidths_gbps:
        if bandwidth is not None and not 0 < bandwidth <= MAX_GBPS:
            raise ClusterError(
                f"a bandwidth must be a positive number of Gbit/s up to "
                f"{MAX_GBPS:g}, got {bandwidth}"
            )
    if host_bandwidth_gbps is not None and not 0 < host_bandwidth_gbps <= MAX_GBPS:
        raise ClusterError(
            f"host bandwidth must be positive and at most {MAX_GBPS:g} Gbit/s, "
            f"got {host_bandwidth_gbps}"
        )
    if device_memory_bytes is not None and not 1 <= device_memory_bytes <= MAX_BYTES:
        raise ClusterError(
            f"device memory must be between 1 and {MAX_BYTES} bytes, got {device_memory_bytes}"
        )
    if len(name) > MAX_NAME_CHARS:
        raise ClusterError(
            f"a cluster name has at most {MAX_NAME_CHARS} characters, got "
            f"{len(name)}: {name[:40]!r}..."
        )
