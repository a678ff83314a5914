"""Sampling on the logits' device: one notion of greedy (greedy.py), per-slot parameters
held on the device (slot_params.py, slots from scheduling/slot_table.py), penalties and sparse
additions (penalties.py), the top-k/top-p/min-p filters (filters.py), counter-based noise
(noise.py) and the exponential-noise draw (draw.py). engine/sampler.py runs them in order.
The logprobs a request asks for are computed and packed for the host by logprobs.py.
"""
