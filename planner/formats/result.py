"""The SimResult format: what the simulator predicts for a plan on a cluster."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pipestudio.planner.formats.documents import Document

OpKind = Literal[
    "forward",
    "backward",
    "weight",
    "recompute",
    "update",
    "send_activation",
    "send_gradient",
    "swap_out",
    "swap_in",
    "allreduce",
]
#: Ops that occupy a worker's compute stream; the others run on links beside it.
COMPUTE_OPS: frozenset[str] = frozenset({"forward", "backward", "weight", "recompute", "update"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryBreakdown(_Strict):
    """Bytes held by one worker at the moment of its peak, by kind."""

    weights_bytes: int
    weight_versions_bytes: int = Field(description="Stashed weight copies besides the live ones.")
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    workspace_bytes: int
    total_bytes: int


class StageResult(_Strict):
    index: int
    layers: list[str]
    replicas: int
    devices: list[int]
    busy_ms: float = Field(description="Compute time per step, mean over replicas.")
    recompute_ms: float = Field(description="Recompute time per step, mean over replicas.")
    swap_bytes: int = Field(description="Bytes swapped out (and back in) per step and replica.")
    peak_bytes: int = Field(description="Largest peak of the stage's replicas.")
    memory: MemoryBreakdown
    device_memory_bytes: int | None = Field(description="Memory of the smallest device used.")
    fits: bool
    max_inflight_microbatches: int = Field(
        description="Most micro-batches whose forward ran and backward did not, on a replica."
    )
    num_weight_versions: int = Field(description="Weight versions kept at once (pipedream).")
    flops: int = Field(
        0,
        description="Floating-point operations per step and replica: "
        "forwards, recomputes and backwards (0: the profile "
        "counts none).",
    )
    tflops: float = Field(
        0.0, description="Achieved TFLOP/s of a replica: flops over the step time."
    )


class TimelineOp(_Strict):
    stage: int
    replica: int
    op: OpKind
    microbatch: int | None = Field(description="Global micro-batch index; null for a step's ops.")
    step: int
    start_ms: float
    end_ms: float
    peer_stage: int | None = Field(None, description="Other end of a transfer.")
    peer_replica: int | None = None
    bytes: int | None = None


class MemoryTrack(_Strict):
    """A worker's memory over time as a step function: bytes from each time on."""

    stage: int
    replica: int
    times_ms: list[float]
    bytes: list[int]


class SimResult(Document):
    """Predicted step time, throughput, memory and timeline of a plan."""

    #: Written by the simulator, read back by programs: computed values, not typed input.
    model_config = ConfigDict(extra="forbid", strict=False)

    format: Literal["pipestudio.simresult"] = "pipestudio.simresult"
    version: Literal[1] = 1
    model: str
    schedule: str
    num_stages: int
    num_microbatches: int
    microbatch_size: int
    num_steps: int = Field(description="Steps measured (pipedream also simulates warm-up/drain).")
    step_time_ms: float = Field(description="Mean time of the measured steps.")
    step_times_ms: list[float] = Field(description="Time of each measured step.")
    samples_per_s: float = Field(description="Samples per second; 0 when a step takes no time.")
    bubble_fraction: float = Field(description="1 - sum of stages' busy_ms / (stages x step time).")
    fits: bool
    device_peak_bytes: list[int] = Field(
        default_factory=list,
        description="Peak of each device, the workers placed on it together (index: device; "
        "0 where none runs): under interleaved-1f1b a device's chunks, whose stages' "
        "peaks are each a chunk's.",
    )
    model_flops: int = Field(
        0,
        description="The model's forward and backward FLOPs per step "
        "(recomputes not counted, as model FLOP "
        "utilisation counts them).",
    )
    model_tflops: float = Field(
        0.0, description="model_flops over the step time, all devices together."
    )
    mfu: float | None = Field(
        None,
        description="Model FLOP utilisation: model_tflops over "
        "the devices' peak in the plan's precision "
        "(null: peak unknown, or no FLOPs counted).",
    )
    window_start_ms: float = Field(description="Start of the measured steps in the timeline.")
    window_end_ms: float
    stages: list[StageResult]
    timeline: list[TimelineOp]
    memory_timeline: list[MemoryTrack]

    @property
    def largest_peak_bytes(self) -> int:
        """The most any device holds: its workers together (a stage's peak where the
        result names no device peaks)."""
        return max(self.device_peak_bytes or [stage.peak_bytes for stage in self.stages])
