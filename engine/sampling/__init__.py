"""Sampling on the logits' device: a batch of logits becomes next tokens, one row per
sequence. sampler.py runs the steps in order: one notion of greedy (greedy.py), per-slot
parameters held on the device (slot_params.py, slots from scheduling/slot_table.py),
penalties and sparse additions (penalties.py), the top-k/top-p/min-p filters (filters.py),
counter-based noise (noise.py) and the exponential-noise draw (draw.py; its Triton kernels
in triton_draw.py and draw_kernels.py). The logprobs a request asks for are computed and
packed for the host by logprobs.py; token_readback.py brings a step's packed answer back
to the host without waiting when the step was launched ahead.
"""
