"""The pipeline engine: runs a Plan on torch.distributed, one process per stage replica
(per device, interleaved).

Vocabulary (as in the planner): a *stage* is a set of layers; a *replica* is one
data-parallel copy of a stage; a *worker* is one (stage, replica) and runs in one process,
its *rank* (stage 0's replicas first; an ``interleaved-1f1b`` rank runs the workers of its
chunks); a *device* is where a worker computes; a
*micro-batch* is ``microbatch_size`` samples and a *step* is ``num_microbatches`` of them
followed by an update (``pipedream`` updates after every micro-batch, and a step is then a
unit of reporting).

Modules: ``config`` (what a run needs) and ``errors``; ``launcher`` (all the processes of a
job, or one rank under torchrun), ``rank`` (one process from start to end), ``rendezvous``
(store, groups, device, clock), ``network`` (the interface gloo and NCCL bind to, and the
check that every peer is reachable), ``layout`` (the plan against the model), ``ops`` (each
worker's op order), ``worker`` (the training loop), ``interleaved`` (an
``interleaved-1f1b`` rank's chunks in one order), ``checkpoint``, ``faults`` (who died),
``exchange`` (small JSON documents between ranks) and ``job`` (a job in a thread of this
process, driven through its controller). Subpackages: ``execution/`` (a stage's forward
and backward, transfers, swap, weight versions, replicas, loss scaling), ``telemetry/``
(measurements) and ``migration/`` (live migration). docs/runtime.md describes the engine;
docs/architecture.md maps the code.
"""

from pipestudio.runtime.engine.config import EngineConfig, OpHook, build_model
from pipestudio.runtime.engine.errors import EngineError, WorkerFailure
from pipestudio.runtime.engine.launcher import TrainResult, check_config, launch, train_from_env
from pipestudio.runtime.engine.layout import EngineLayout
from pipestudio.runtime.engine.ops import Op
from pipestudio.runtime.engine.telemetry.metrics import Event, EventSink, JsonlSink

__all__ = [
    "EngineConfig",
    "EngineError",
    "EngineLayout",
    "Event",
    "EventSink",
    "JsonlSink",
    "Op",
    "OpHook",
    "TrainResult",
    "WorkerFailure",
    "build_model",
    "check_config",
    "launch",
    "train_from_env",
]
