"""The engine's HTTP server: OpenAI-compatible API, vLLM-compatible metrics, admin API.

app.py           FastAPI app factory: /v1/*, /health, /ready, /metrics, errors, drain
engine_core.py   the engine core process: owns LLMEngine, steps it, sends deltas
core_client.py   the API side: starts the core, sends requests, rebuilds outputs
core_messages.py the msgspec messages between the two (over ZeroMQ)
serving.py       OpenAI request -> engine request -> OpenAI response / SSE chunks
streaming.py     server-sent events; client disconnects abort at once
logprobs.py      log-probabilities in OpenAI's completion and chat shapes
api_models.py    pydantic request models (unknown fields refused as OpenAI does)
errors.py        OpenAI-style error objects
middleware.py    request-body limit (413) and http_requests_total
chat.py          chat template rendering
metrics.py       vllm:* and inferd_* metrics
snapshot.py      the engine state copy that /metrics reads
admin.py         /admin/config, /admin/mode, /admin/fault behind a bearer token
tracing.py       one OpenTelemetry span per request
cli.py           `inferd serve`
"""
