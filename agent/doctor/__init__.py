"""`inferd doctor`: cross-layer diagnosis of an inference node.

One module per check (placement, pcie, copy_bandwidth, gpu_health, engine, kv_cache,
saturation, configuration), each a `Check` (agent.doctor.check) returning `Finding`s
(agent.doctor.findings) judged by `Thresholds` (agent.doctor.thresholds). The runner
gathers the inputs once (agent.doctor.inputs), runs the checks and ranks the findings;
agent.doctor.render prints them as a table or as JSON (agent.doctor.schema).
docs/DOCTOR.md is the manual.
"""
