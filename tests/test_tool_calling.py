"""Tool calling through the official `openai` client against a real server, one per
chat-template family (Llama 3.1 JSON, Hermes / Qwen 2.5, Mistral).

A random checkpoint never calls a tool by itself, so the round trips run on an engine
whose sampled tokens follow a recorded reply when the prompt asks for the weather in
Paris (a tool call in the family's own format), or holds the tool's result (a final
answer): the rest (template, tokenizer, scheduler, detokenizer, parser, streaming, the
client) is the real thing. `tool_choice` required / a named function run on the plain
random model, under structured outputs."""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace

import httpx
import jsonschema
import openai
import pytest

from inferd.engine.server.errors import ApiError
from inferd.engine.server.serving import OpenAIServing
from inferd.engine.server.tool_parsers.tool_choice import ToolRequest
from inferd.engine.text.tokenizer import Tokenizer

from server_fixtures import MODEL_NAME, ServerThread, build_app

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string"}, "hour24": {"type": "boolean"}},
            "required": ["tz", "hour24"],
        },
    },
}
TOOLS = [WEATHER, TIME]
QUESTION = "What is the weather in Paris?"
RESULT = "sunny and 24 degrees"
ANSWER = "It is sunny in Paris."
FAMILIES = {  # family -> (architecture, the recorded tool-call reply)
    "llama3.1": ("llama", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "hermes": ("qwen2", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    "mistral": ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
}


def scripted_engine(reply: str, config):
    """An LLMEngine whose sampled tokens spell `reply` (then end of turn) when the prompt
    asks QUESTION, or ANSWER once the prompt holds the tool's RESULT (built in the
    engine core process)."""
    from inferd.engine.llm_engine import LLMEngine

    engine = LLMEngine(config)
    tok = engine.tokenizer
    scripts = [
        (RESULT, tok.encode(ANSWER, add_special_tokens=False)),
        (QUESTION, tok.encode(reply, add_special_tokens=False)),
    ]
    real = engine._execute_and_sample

    def execute_and_sample(batch, sampling):
        tokens, logprobs = real(batch, sampling)
        for i, seq in enumerate(sampling):
            prompt = tok.decode(list(seq.prompt_token_ids), skip_special_tokens=False)
            for marker, script in scripts:
                if marker in prompt:
                    n = len(seq.output_token_ids)
                    tokens[i] = script[n] if n < len(script) else tok.eos_token_ids[0]
                    break
        return tokens, logprobs

    engine._execute_and_sample = execute_and_sample
    return engine


def family_model(model_factory, family: str) -> str:
    return model_factory(preset="tiny", arch=FAMILIES[family][0], chat_template_family=family)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_server(request, model_factory):
    family = request.param
    factory = functools.partial(scripted_engine, FAMILIES[family][1])
    server = ServerThread(build_app(family_model(model_factory, family), engine_factory=factory)).start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    try:
        yield family, server, client
    finally:
        server.stop()


def chat(client, messages, **kw):
    kw.setdefault("max_tokens", 80)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL_NAME, messages=messages, **kw)


def collect_stream(client, messages, **kw):
    """The streamed chunks folded as a client does: content, calls by index, finish reason."""
    content, calls, finish = "", {}, None
    for chunk in chat(client, messages, stream=True, **kw):
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for d in delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    assert call["id"] is None and d.function.name and d.type == "function"
                    call["id"], call["name"] = d.id, d.function.name
                else:
                    assert call["id"] is not None, "the id and name come first"
                call["arguments"] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [calls[k] for k in sorted(calls)], finish


def tool_result_messages(call_id: str, arguments: str) -> list[dict]:
    return [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": RESULT},
    ]


def test_round_trip(family_server):
    family, _, client = family_server
    first = chat(client, [{"role": "user", "content": QUESTION}], tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    final = chat(client, tool_result_messages(call.id, call.function.arguments), tools=TOOLS)
    choice = final.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == ANSWER
    assert not choice.message.tool_calls
    # The history reached the template: the tool's result is in the prompt (the script saw it).
    assert final.usage.prompt_tokens > first.usage.prompt_tokens


def test_round_trip_streaming(family_server):
    family, _, client = family_server
    whole = chat(client, [{"role": "user", "content": QUESTION}], tools=TOOLS).choices[0].message.tool_calls[0]
    content, calls, finish = collect_stream(client, [{"role": "user", "content": QUESTION}], tools=TOOLS)
    assert finish == "tool_calls"
    assert content == ""
    (call,) = calls
    assert call["id"].startswith("call_")
    assert (call["name"], call["arguments"]) == (whole.function.name, whole.function.arguments)

    content, calls, finish = collect_stream(client, tool_result_messages(call["id"], call["arguments"]), tools=TOOLS)
    assert (content, calls, finish) == (ANSWER, [], "stop")


def test_tool_choice_none_returns_the_text(family_server):
    family, _, client = family_server
    choice = chat(client, [{"role": "user", "content": QUESTION}], tools=TOOLS, tool_choice="none").choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "stop"
    assert "get_weather" in choice.message.content


def test_auto_on_the_random_model_is_content(family_server):
    """The unscripted random model writes no call: its text comes back as content,
    streamed or not, the same."""
    _, _, client = family_server
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello, world!"}]
    whole = chat(client, messages, tools=TOOLS, max_tokens=16).choices[0]
    content, calls, finish = collect_stream(client, messages, tools=TOOLS, max_tokens=16)
    assert not whole.message.tool_calls and calls == []
    assert content == (whole.message.content or "")
    assert finish == whole.finish_reason


def test_parallel_tool_calls_false_keeps_the_first(family_server):
    _, _, client = family_server
    choice = chat(client, [{"role": "user", "content": QUESTION}], tools=TOOLS, parallel_tool_calls=False).choices[0]
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_template_renders_as_transformers_does(model_factory, family):
    """The prompt of a conversation with tools, a call (content null) and its result,
    and text parts, is transformers' apply_chat_template's, token for token."""
    from transformers import AutoTokenizer

    from inferd.engine.server.api_models import ChatMessage
    from inferd.engine.server.chat import render_chat, template_messages

    model = family_model(model_factory, family)
    call_id = "call_0123456789abcdef"
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "You are "}, {"type": "text", "text": "terse."}]},
        *tool_result_messages(call_id, '{"city": "Paris", "unit": "celsius"}'),
    ]
    tok = Tokenizer(model)
    ours = render_chat(
        template_messages([ChatMessage(**m) for m in messages], short_ids=family == "mistral"),
        tok.chat_template,
        tok.bos_token,
        tok.eos_token,
        tools=TOOLS,
    )
    reference = json.loads(json.dumps(messages))
    reference[0]["content"] = "You are terse."
    reference[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris", "unit": "celsius"}
    if family == "mistral":  # its template takes 9-character ids; vLLM keeps the last 9 too
        reference[2]["tool_calls"][0]["id"] = reference[3]["tool_call_id"] = call_id[-9:]
    hf = AutoTokenizer.from_pretrained(model)
    expected = hf.apply_chat_template(reference, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert ours == expected
    assert "get_time" in ours and RESULT in ours  # the definitions and the result are in it
    if family != "mistral":  # Mistral's template writes no generation prompt
        assert tok.encode(ours, add_special_tokens=False) == hf(expected, add_special_tokens=False)["input_ids"]


# --- forced calls: structured outputs on the random model -----------------------------------


@pytest.fixture(scope="module", params=list(FAMILIES))
def random_family_server(request, model_factory):
    family = request.param
    server = ServerThread(build_app(family_model(model_factory, family))).start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        yield family, server, client
    finally:
        server.stop()


# Bounded values: a random model under a schema writes a free string until it happens to
# close the quote, which may take longer than any max_tokens.
FORCED_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"enum": ["Paris", "Lyon", "Oslo"]},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"enum": ["UTC", "CET"]}, "hour24": {"type": "boolean"}},
                "required": ["tz", "hour24"],
                "additionalProperties": False,
            },
        },
    },
]


@pytest.mark.slow
def test_required_always_yields_a_valid_call(random_family_server):
    _, _, client = random_family_server
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in FORCED_TOOLS}
    for seed in range(12):
        choice = chat(
            client,
            [{"role": "user", "content": QUESTION}],
            tools=FORCED_TOOLS,
            tool_choice="required",
            temperature=1.0,
            seed=seed,
            max_tokens=120,
        ).choices[0]
        assert choice.finish_reason == "tool_calls", choice
        call = choice.message.tool_calls[0]
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


@pytest.mark.slow
def test_named_function_is_called(random_family_server):
    _, _, client = random_family_server
    for seed in range(4):
        content, calls, finish = collect_stream(
            client,
            [{"role": "user", "content": "What time is it?"}],
            tools=FORCED_TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            temperature=1.0,
            seed=seed,
            max_tokens=120,
        )
        assert finish == "tool_calls" and [c["name"] for c in calls] == ["get_time"]
        jsonschema.validate(json.loads(calls[0]["arguments"]), FORCED_TOOLS[1]["function"]["parameters"])


# --- client mistakes: 400 naming the field --------------------------------------------------

# Its parameters do not compile into a grammar: a forced call under it would end empty.
BROKEN_PARAMETERS = {"type": "function", "function": {"name": "broken", "parameters": {"type": "nope"}}}

BAD_REQUESTS = [
    ({"tools": [BROKEN_PARAMETERS], "tool_choice": "required"}, "tools[0].function.parameters"),
    (
        {"tools": [WEATHER, BROKEN_PARAMETERS], "tool_choice": {"type": "function", "function": {"name": "broken"}}},
        "tools[1].function.parameters",
    ),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools[0].function.parameters"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    (
        {"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": RESULT}]},
        "messages[1].tool_call_id",
    ),
    (
        {"messages": tool_result_messages("call_1", "{not json")},
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        {"messages": tool_result_messages("call_1", "[1, 2]")},
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        {"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]},
        "messages[0].tool_calls",
    ),
]


def test_bad_tool_requests_are_400(family_server):
    _, server, _ = family_server
    for extra, param in BAD_REQUESTS:
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4, **extra}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400, (extra, r.text)  # a wrong type too, as OpenAI and vLLM answer it
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == param, (extra, error)


def test_parser_choice(tiny_model):
    """The default checkpoint's template names no format: auto needs --tool-call-parser;
    the option overrides what a template names."""
    engine = SimpleNamespace(tokenizer=Tokenizer(tiny_model))
    plain = OpenAIServing(engine, MODEL_NAME)  # type: ignore[arg-type]
    assert plain.tool_call_parser is None
    with pytest.raises(ApiError) as raised:
        plain._tool_parser(ToolRequest(TOOLS, "auto"))
    assert raised.value.status == 400 and raised.value.param == "tool_choice"
    assert "--tool-call-parser" in raised.value.message
    assert plain._tool_parser(ToolRequest(TOOLS, "none")) is None
    forced = OpenAIServing(engine, MODEL_NAME, "mistral")  # type: ignore[arg-type]
    parser = forced._tool_parser(ToolRequest(TOOLS, "auto"))
    assert parser is not None and parser.name == "mistral" and parser.eos_token == "<|eot_id|>"
    with pytest.raises(ValueError, match="hermes"):
        OpenAIServing(engine, MODEL_NAME, "pythonic")  # type: ignore[arg-type]
