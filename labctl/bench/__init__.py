"""Benchmarks: the ring cost model, allreduce against the wire, tokens/s scaling, stragglers, `labctl up`."""
