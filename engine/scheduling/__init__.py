"""Scheduling: which sequences run each step and what the step computes. scheduler.py is
continuous batching with chunked prefill, priorities and preemption, and the one writer of
sequence and block state (through kv/block_manager.py); async_scheduler.py adds the decode
step launched ahead of the host. request_order.py is the order it serves in (priorities,
aging, SLO tiers by slack), with TTFT predicted from measured step rates
(ttft_predictor.py); slot_table.py gives each running sequence its row in the sampler's
tables; scheduler_output.py is what a step hands the runner and the KV cache."""
