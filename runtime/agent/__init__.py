"""The worker agent: ``pipestudio worker --server URL --token TOKEN``.

It registers this machine's devices with the backend over ``/ws/worker``, starts engine
processes for the ranks the backend assigns (against the ``torch.distributed`` store the
backend hands out: the worker holding rank 0 opens it on port 0 and reports it), relays the
engine's events up and the backend's commands down. Messages are numbered and kept until
the backend acks them, so nothing is lost across reconnects (``outbox.py``; the protocol is
described in ``backend/protocol.py`` and docs/backend.md).

``outbox`` and ``connection`` import no torch: the load benchmark simulates workers with
them. ``ranks`` (the engine processes) and ``devices`` import torch.
"""
