"""PipeStudio: plan, simulate and run pipeline-parallel training of PyTorch models.

The package's parts are the checkout's top-level folders, linked in here: ``planner``,
``runtime``, ``backend``, ``dashboard`` and ``migrations`` (``alembic/``); this folder
holds the command line (``cli/``) and ``demo.py``. docs/architecture.md maps the code.

Vocabulary, used the same way everywhere in the code, the formats and the docs:

layer        the unit a profile measures and a plan places (a module, or an operator in
             fine-grained profiles).
stage        a contiguous part of the pipeline: a set of layers run one after the other.
replica      one copy of a stage; a stage with r replicas processes every r-th micro-batch
             on each copy and all-reduces gradients among them (PipeDream's replication).
worker       one (stage, replica) pair: one process of the engine, on one device.
device       one accelerator (or CPU) with its own memory.
rank         a worker's index in the torch.distributed process group.
micro-batch  the slice of a step's batch that moves through the pipeline as one unit.
step         one optimizer step for the synchronous schedules (gpipe, 1f1b): all of its
             micro-batches, a flush and an update. For the asynchronous `pipedream` schedule,
             which updates after every micro-batch, a step is a group of
             `num_microbatches` consecutive micro-batches, the unit of reporting.
"""

__version__ = "0.1.0"
