"""The documents PipeStudio reads and writes, each a versioned JSON format with a published
schema: ``profile`` (per-layer times and sizes), ``cluster`` (devices and links), ``plan``
(stages, replicas, schedule, memory policies), ``result`` (the simulator's prediction) and
``proposal`` (a migration of a running job); ``documents`` (bounded fields, loading,
readable errors), ``schemas`` (the published JSON Schemas) and ``pipedream`` (PipeDream's
profiles imported as a Profile). docs/formats.md describes them.
"""
