"""The engine's HTTP server: OpenAI-compatible API, vLLM-compatible metrics, admin API.

The two processes
cli.py                  `inferd serve`
app.py                  FastAPI app: wires the engine core client, the routes, the errors, the drain
engine_core.py          the engine core process: owns LLMEngine, steps it, sends deltas
core_client.py          the API side: starts the core, sends requests, rebuilds outputs
core_messages.py        the msgspec messages between the two (over ZeroMQ)
core_dirs.py            the temporary folders that hold the core's sockets
parent_death.py         an engine its agent started dies with the agent
drain.py                SIGTERM: refuse new work, finish what is in flight, stop

Routes
openai_routes.py        POST /v1/completions, POST /v1/chat/completions, GET /v1/models
token_routes.py         vLLM's /tokenize, /detokenize, /version, GET /v1/models/{model}
probe_routes.py         GET /health, /ready, /metrics
admin.py                /admin/config, /admin/mode, /admin/fault behind a bearer token
openapi_doc.py          what the OpenAPI document says beyond what FastAPI derives

Serving a request
serving.py              OpenAIServing: OpenAI request -> checked Job -> admitted -> response
api_models.py           pydantic request models
unknown_fields.py       request fields the API does not declare: ignored or refused, as vLLM does
job.py                  Job: one request's prompts, parameters, ids and stream state
prompt_encoding.py      chat messages -> prompt text -> token ids
chat.py                 chat template rendering
chat_tools.py           tool calls: the parser, a forced call's constraint, a choice's calls
tool_parsers/           the formats models write tool calls in
admission.py            refuse what cannot make its deadline; bound the queue
job_outputs.py          a job's prompts run in the engine, outputs merged as they come
response_bodies.py      the whole response of a request that does not stream
stream_chunks.py        the SSE chunks of one that does (text held back, tool call deltas)
streaming.py            server-sent events; client disconnects abort at once
logprobs.py             log-probabilities in OpenAI's completion and chat shapes
errors.py               OpenAI-style error objects
error_handlers.py       every error in that shape, whoever raised it

HTTP plumbing and observability
middleware.py           request-body limit (413), http_requests_total, X-Request-Id
http_limits.py          connection time and size limits for uvicorn
limited_h11_protocol.py uvicorn's h11 protocol with those limits
metrics.py              vllm:* and inferd_* metrics
slo_metrics.py          per-SLO-class latency, attainment and shedding
snapshot.py             the engine state copy that /metrics reads
tracing.py              one OpenTelemetry span per request
"""
