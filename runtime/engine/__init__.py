"""The pipeline engine: runs a Plan on torch.distributed, one process per stage replica.

Vocabulary (as in the planner): a *stage* is a set of layers; a *replica* is one
data-parallel copy of a stage; a *worker* is one (stage, replica) and runs in one process,
its *rank* (stage 0's replicas first); a *device* is where a worker computes; a
*micro-batch* is ``microbatch_size`` samples and a *step* is ``num_microbatches`` of them
followed by an update (``pipedream`` updates after every micro-batch, and a step is then a
unit of reporting).

Modules: ``layout`` (the plan against the model), ``ops`` (each worker's op order),
``rendezvous`` (store, groups, device, clock), ``transport`` (point-to-point tensors),
``stage`` (forward and backward under memory policies), ``swap``, ``weights`` (weight
stashing, vertical sync), ``replicas`` (gradient all-reduce), ``worker`` (the loop),
``metrics``/``clock``/``measured`` (measurements), ``checkpoint``, ``faults`` (who died),
``rank`` (one process) and ``launcher`` (all of them). docs/runtime.md describes it.
"""

from pipestudio.runtime.engine.config import EngineConfig, OpHook, build_model
from pipestudio.runtime.engine.errors import EngineError, WorkerFailure
from pipestudio.runtime.engine.launcher import TrainResult, check_config, launch, train_from_env
from pipestudio.runtime.engine.layout import EngineLayout
from pipestudio.runtime.engine.metrics import Event, EventSink, JsonlSink
from pipestudio.runtime.engine.ops import Op

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
