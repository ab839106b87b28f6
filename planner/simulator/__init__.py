"""The schedule simulator and what feeds it: per-stage work and memory, the op order
of each worker, the event engine, the memory ledger, shared ranks, device peaks, the work
budget, calibration from measured runs, and Chrome trace export."""
