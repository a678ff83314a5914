"""The engine's HTTP server: OpenAI-compatible API, vLLM-compatible metrics, admin API.

    app.py           FastAPI app factory: /v1/*, /health, /metrics, error handlers
    async_engine.py  the engine thread and the per-request queues that feed asyncio
    serving.py       OpenAI request -> engine request -> OpenAI response / SSE chunks
    api_models.py    pydantic request models (unknown fields refused as OpenAI does)
    errors.py        OpenAI-style error objects
    chat.py          chat template rendering
    metrics.py       vllm:* and inferd_* metrics
    admin.py         /admin/config, /admin/mode, /admin/fault behind a bearer token
    tracing.py       one OpenTelemetry span per request
    cli.py           `inferd serve`
"""
