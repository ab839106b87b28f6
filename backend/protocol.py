"""The worker protocol on ``/ws/worker`` and the dashboard stream on ``/ws/runs/{id}``.

Every message is a JSON object with a ``type``. A worker connects with
``Authorization: Bearer <worker token>`` (or ``?token=``) and says ``hello``::

    worker -> server   hello        worker_id (null when the process starts), name, host,
                                    devices, slots, next_seq (its lowest unacked number),
                                    last_seq (the highest it has numbered), runs [{run_id,
                                    attempt, ranks}], models (its built-in models),
                                    allowed_models (patterns of the factories it runs),
                                    probe_port (where its link probe listens, or null)
    server -> worker   welcome      worker_id, secret (to say with worker_id next time),
                                    last_seq, heartbeat_s
    worker -> server   heartbeat    every heartbeat_s seconds
    worker -> server   events       seq, run_id, events [engine events, each with sent_at]
    worker -> server   store        seq, run_id, attempt, host, port      (rank 0's worker)
    worker -> server   run_state    seq, run_id, attempt, state, message  (its ranks
                                    started/ended), retry (false: it refused the
                                    assignment, and no attempt resumes the run)
    worker -> server   command_result  seq, run_id, command_id, ok, message
    server -> worker   ack          seq                           (stored, exactly once)
    server -> worker   assign       run_id, attempt, world_size, ranks, config, open_store,
                                    host_ranks
    server -> worker   rendezvous   run_id, attempt, host, port
    server -> worker   command      command_id, run_id, command (stop | migrate), payload
    server -> worker   probe_expect request_id, key    (accept one probe connection with key)
    server -> worker   measure_link request_id, host, port, key, seconds  (measure the link
                                    to another worker's probe: ``runtime/agent/links.py``)
    worker -> server   reply        request_id, ok, message, and for measure_link gbps,
                                    latency_ms, bytes, seconds            (unnumbered)

Messages with a ``seq`` are numbered 1, 2, ... per worker. The server stores them in order
in one transaction with the worker's ``last_seq`` and acks; a repeat (seq <= last_seq) is
acked and dropped, a gap (seq > last_seq + 1) closes the connection. A worker keeps every
message until acked and resends the unacked ones after ``welcome`` on a new connection, so
metrics buffered while the server was away are neither lost nor stored twice. A message
the server cannot store (a field of the wrong type or out of range, text with a NUL, a run
the worker has no rank in) is rejected alone: acked like a stored one, never resent, and
recorded on its run as a ``rejected`` event; NaN and infinities in metrics are data
(stored as the strings "NaN", "Infinity", "-Infinity").

A worker that comes back is known by its ``worker_id`` said with the ``secret`` its last
``welcome`` gave (kept across restarts by the agent; another connection cannot take a
worker's id); a restarted process numbers from 1 again (its ``last_seq`` is below the
stored one). The runs its ``hello`` does not list are judged
only after the messages it numbered before the ``hello`` (up to ``last_seq``) are stored:
a run that ended while the server was away is not taken for lost.

A ``reply`` answers a request that lives as long as the connection: it is not numbered,
stored or resent. One that answers no pending request of its worker is dropped; one whose
fields are not a reply's closes the connection with 1007, and the request fails.

Frames that are not protocol messages close the connection: a binary frame with 1003, text
that is not a JSON object or a malformed ``hello``, ``seq`` or ``reply`` with 1007, an
unnumbered message other than ``heartbeat`` and ``reply`` with 1008, a bad worker token
with 4401, no ``hello`` first with 4400.

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

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

METRIC_KINDS = ("op", "step", "memory")
WORKER_CLOSE_AUTH = 4401
WORKER_CLOSE_PROTOCOL = 4400
#: Close codes of RFC 6455: a frame type, or data, the endpoint cannot accept; a policy.
CLOSE_UNSUPPORTED = 1003
CLOSE_INVALID = 1007
CLOSE_POLICY = 1008
MAX_SEQ = 2**62
#: The largest id and step a 32-bit SQL column holds (``schemas.common.MAX_ID`` too).
MAX_DB_INT = 2**31 - 1
#: A close frame's reason holds at most 123 bytes of UTF-8.
_MAX_REASON_BYTES = 123


def close_reason(text: str) -> str:
    """``text`` cut to fit a close frame."""
    return text.encode()[:_MAX_REASON_BYTES].decode(errors="ignore")


#: A short text a worker advertises (a device's field, a model's name or pattern): it is
#: stored and listed to every reader, so a hello cannot make the listing huge.
Short = Annotated[str, Field(max_length=200)]
#: One device as a worker describes it: at most 32 fields of short names and values.
Device = Annotated[
    dict[Annotated[str, Field(max_length=64)], Short | int | float | bool | None],
    Field(max_length=32),
]


class _Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class HelloRun(_Message):
    run_id: int = Field(ge=1, le=MAX_DB_INT)
    attempt: int = Field(0, ge=0, le=MAX_DB_INT)
    ranks: list[int] = Field(default_factory=list, max_length=100_000)


class Hello(_Message):
    """A worker's first message (module docstring)."""

    type: Literal["hello"]
    worker_id: str | None = Field(None, min_length=1, max_length=64)
    secret: str | None = Field(None, min_length=1, max_length=128)
    name: str = Field("worker", min_length=1, max_length=200)
    host: str = Field("", max_length=200)
    devices: list[Device] = Field(default_factory=list, max_length=1024)
    slots: int | None = Field(None, ge=0, le=1024)
    next_seq: int = Field(1, ge=1, le=MAX_SEQ)
    last_seq: int | None = Field(None, ge=0, le=MAX_SEQ)
    runs: list[HelloRun] = Field(default_factory=list, max_length=10_000)
    models: list[Short] = Field(default_factory=list, max_length=1000)
    allowed_models: list[Short] = Field(default_factory=list, max_length=1000)
    probe_port: int | None = Field(None, ge=1, le=65535)


#: Bounds of a measured link: a hostile worker's numbers stay within what a link can be.
MAX_GBPS = 1e6
MAX_LATENCY_MS = 1e6


class Reply(_Message):
    """A worker's answer to ``probe_expect`` or ``measure_link`` (module docstring)."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    type: Literal["reply"]
    request_id: str = Field(min_length=1, max_length=64)
    ok: bool
    message: str | None = Field(None, max_length=2000)
    gbps: float | None = Field(None, gt=0, le=MAX_GBPS)
    latency_ms: float | None = Field(None, ge=0, le=MAX_LATENCY_MS)
    bytes: int | None = Field(None, ge=0, le=2**40)
    seconds: float | None = Field(None, ge=0, le=3600)
