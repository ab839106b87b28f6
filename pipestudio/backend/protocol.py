"""The worker protocol on ``/ws/worker`` and the dashboard stream on ``/ws/runs/{id}``.

Every message is a JSON object with a ``type``. A worker connects with
``Authorization: Bearer <worker token>`` (or ``?token=``) and says ``hello``::

    worker -> server   hello        worker_id (null the first time), name, host, devices,
                                    slots, next_seq, runs [{run_id, ranks}]
    server -> worker   welcome      worker_id, last_seq, heartbeat_s
    worker -> server   heartbeat    every heartbeat_s seconds
    worker -> server   events       seq, run_id, events [engine events, each with sent_at]
    worker -> server   store        seq, run_id, attempt, host, port      (rank 0's worker)
    worker -> server   run_state    seq, run_id, attempt, state, message  (its ranks
                                    started/ended), retry (false: it refused the
                                    assignment, and no attempt resumes the run)
    worker -> server   command_result  seq, run_id, command_id, ok, message
    server -> worker   ack          seq                           (stored, exactly once)
    server -> worker   assign       run_id, attempt, world_size, ranks, config, open_store
    server -> worker   rendezvous   run_id, attempt, host, port
    server -> worker   command      command_id, run_id, command (stop | migrate), payload

Messages with a ``seq`` are numbered 1, 2, ... per worker. The server stores them in order
in one transaction with the worker's ``last_seq`` and acks; a repeat (seq <= last_seq) is
acked and dropped, a gap (seq > last_seq + 1) closes the connection. A worker keeps every
message until acked and resends the unacked ones after ``welcome`` on a new connection, so
metrics buffered while the server was away are neither lost nor stored twice.

Launch: the server assigns ranks (stage 0's replicas first) and sends ``assign``; the
worker holding rank 0 opens a ``torch.distributed`` TCPStore on port 0 and reports it in
``store``; the server sends ``rendezvous`` to every worker of the run, which start their
ranks' engine processes against that store.

Resume: a run created with ``on_failure: resume`` whose ranks fail (or whose worker falls
silent) is not failed while it has resumes left: the server tells the workers to stop
that attempt (``stop`` with its ``attempt``), frees its ranks and, once enough slots are
free on connected workers, assigns the next attempt, whose ``config`` has ``resume``
true and the run's ``checkpoint_dir``, so the engine continues from the last complete
checkpoint. ``store`` and ``run_state`` of an earlier attempt are dropped.

The dashboard stream sends ``run`` (the run, now and on every state change), ``metrics``
(engine events ``op``, ``step``, ``memory``, streamed as the next numbered message
arrives, before its commit; a message streamed but then not stored is resent and may be
streamed twice, never lost), ``event`` (``start``, ``error``,
``summary``, migrations...) and ``proposal`` messages.
"""

METRIC_KINDS = ("op", "step", "memory")
WORKER_CLOSE_AUTH = 4401
WORKER_CLOSE_PROTOCOL = 4400
