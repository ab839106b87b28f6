"""The schedule simulator and what feeds it: ``simulate`` (a plan's ops on a cluster, run
by ``events``' discrete-event engine), ``schedule`` (each worker's op order), ``costs``
(per-stage work and memory), ``memory`` (the memory ledger), ``placement`` (ranks that share
a host's cores or a GPU), ``peaks`` (devices' peak FLOP/s), ``budget`` (the work a
simulation would do, counted first), ``calibrate`` (the profile a run's measurements say
the plan has) and ``trace`` (Chrome trace export). docs/simulator.md describes it.
"""
