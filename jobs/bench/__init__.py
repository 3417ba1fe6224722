"""Benchmarks: strategies in-process and whole jobs against their peers, `model.compile`, planning and
bookkeeping at scale."""
