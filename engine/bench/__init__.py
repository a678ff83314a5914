"""Benchmarks: `inferd bench serve` (the server under rising load) and `inferd bench throughput`."""
