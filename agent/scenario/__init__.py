"""Scenario benchmarks of the closed loop: the real stack under a scripted workload, recorded."""
