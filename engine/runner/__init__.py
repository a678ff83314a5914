"""Running the model on a scheduled batch. model_runner.py builds the inputs and attention
metadata, runs the forward on the fast path or the portable one and returns a RunnerOutput
(runner_output.py); runner_protocol.py is what the engine and AsyncDecode use of any runner
(ModelRunner, or parallel/'s TPRunner); fastpath_faults.py says which exceptions leave the
fast path and which are our own launch bugs. async_decode.py launches the next decode step
before the host has read the current one's tokens. Deterministic mode's batch-invariant
forward is batch_invariant.py, with its fused GPU steps (batch_invariant_fused.py) and
decode graphs (batch_invariant_graphs.py)."""
