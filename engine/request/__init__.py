"""A request, from what it asks for to what it gets back: its sampling parameters
(sampling_params.py) and SLO class (slo.py), its check against the engine's limits without
engine state (request_validator.py), the Request and its Sequences with their tokens and
block tables (sequence.py; their scheduling state has one writer, the scheduler), and its
results (outputs.py, and prompt_logprobs.py: the prompt's own logprobs, which the runner
scores on the device)."""
