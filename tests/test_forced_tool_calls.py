"""tool_choice "required" and a named function on a model whose chat template names no
tool-call format (the default checkpoint's plain Llama 3 template, no --tool-call-parser):
vLLM's JSON, generated under structured outputs and parsed back into tool_calls, streamed
or not. The format's shape and parsing are tested on text; the round trips run on the
random model, whose every reply the grammar makes a valid call."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import openai
import pytest

from inferd.engine.server.errors import ApiError
from inferd.engine.server.serving import OpenAIServing
from inferd.engine.server.tool_parsers import ToolCallStream, make_tool_parser
from inferd.engine.server.tool_parsers.forced_json import JsonArrayToolParser, NamedArgumentsToolParser
from inferd.engine.server.tool_parsers.tool_choice import ToolRequest, forced_call_constraint, tool_request
from inferd.engine.structured_outputs.limits import StructuredOutputsLimits
from inferd.engine.structured_outputs.params import StructuredOutputsParams
from inferd.engine.structured_outputs.request import check_constraint
from inferd.engine.text.tokenizer import Tokenizer

from server_fixtures import MODEL_NAME, ServerThread, build_app

# Bounded values: a random model under a schema writes a free string until it happens to
# close the quote, which may take longer than any max_tokens.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Lyon", "Oslo"]},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
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
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
NAMES = list(SCHEMAS)
GET_TIME = {"type": "function", "function": {"name": "get_time"}}
# A pydantic model's schema: its nested model is a $ref into the schema's own $defs.
POINT = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
PLACE = {
    "type": "function",
    "function": {
        "name": "go_to",
        "parameters": {
            "$defs": {"Point": POINT},
            "type": "object",
            "properties": {"where": {"$ref": "#/$defs/Point"}},
            "required": ["where"],
        },
    },
}


def streamed(parser, text: str, step: int, max_calls: int = 0) -> tuple[str, list[tuple[str, str]], bool]:
    """`text` fed `step` characters at a time: content, (name, arguments) per call, and
    whether it finished as tool calls."""
    s = ToolCallStream(parser, NAMES, max_calls)
    content, calls = "", {}
    ends = [*range(step, len(text), step), len(text)]
    for end in ends:
        update = s.update(text[:end], end == len(text))
        content += update.content
        for d in update.tool_calls:
            name, arguments = calls.get(d["index"], (None, ""))
            calls[d["index"]] = (name or d["function"]["name"], arguments + d["function"]["arguments"])
    return content, [calls[k] for k in sorted(calls)], update.is_tool_call


# --- the format, on text ----------------------------------------------------------------------


def test_without_a_format_required_and_named_get_vllms_json(tiny_model):
    """The default template names no format: a forced call is vLLM's JSON; auto still
    needs --tool-call-parser."""
    serving = OpenAIServing(SimpleNamespace(tokenizer=Tokenizer(tiny_model)), MODEL_NAME)  # type: ignore[arg-type]
    assert serving.tool_call_parser is None
    assert isinstance(serving._tool_parser(ToolRequest(TOOLS, "required")), JsonArrayToolParser)
    named = serving._tool_parser(ToolRequest(TOOLS, "named", named="get_time"))
    assert isinstance(named, NamedArgumentsToolParser) and named.function_name == "get_time"
    with pytest.raises(ApiError) as raised:
        serving._tool_parser(ToolRequest(TOOLS, "auto"))
    assert raised.value.status == 400 and raised.value.param == "tool_choice"
    assert "--tool-call-parser" in raised.value.message and '"required"' in raised.value.message


@pytest.mark.parametrize(
    "choice, parallel, instance, calls",
    [
        (
            "required",
            None,
            [{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}}],
            [("get_weather", '{"city": "Oslo", "unit": "celsius"}')],
        ),
        (
            "required",
            None,
            [
                {"name": "get_time", "parameters": {"tz": "UTC", "hour24": True}},
                {"name": "get_weather", "parameters": {"city": "Lyon", "unit": "fahrenheit"}},
            ],
            [("get_time", '{"tz": "UTC", "hour24": true}'), ("get_weather", '{"city": "Lyon", "unit": "fahrenheit"}')],
        ),
        (
            "required",
            False,
            [{"name": "get_time", "parameters": {"tz": "CET", "hour24": False}}],
            [("get_time", '{"tz": "CET", "hour24": false}')],
        ),
        (GET_TIME, None, {"tz": "UTC", "hour24": True}, [("get_time", '{"tz": "UTC", "hour24": true}')]),
    ],
)
def test_what_a_forced_call_is_generated_as_parses_back(choice, parallel, instance, calls):
    """JSON valid under the constraint (as structured outputs generate it: ", " and ": "
    separators) is the same calls whole and streamed, any chunking."""
    request = tool_request(TOOLS, choice, parallel)
    assert request is not None and request.is_forced
    parser = JsonArrayToolParser() if choice == "required" else NamedArgumentsToolParser("get_time")
    constraint = forced_call_constraint(parser, request)
    assert (constraint["before"], constraint["after"]) == ("", "")
    jsonschema.validate(instance, constraint["json"])
    text = json.dumps(instance)
    found = parser.extract(text, NAMES)
    assert found.content is None
    assert [(c.name, c.arguments) for c in found.tool_calls] == calls
    for step in (1, 4, 10_000):
        assert streamed(parser, text, step) == ("", calls, True)


def test_the_constraint_allows_only_offered_calls():
    required = forced_call_constraint(JsonArrayToolParser(), tool_request(TOOLS, "required", None))["json"]
    one = forced_call_constraint(JsonArrayToolParser(), tool_request(TOOLS, "required", False))["json"]
    named = forced_call_constraint(NamedArgumentsToolParser("get_time"), tool_request(TOOLS, GET_TIME, None))["json"]
    call = {"name": "get_time", "parameters": {"tz": "UTC", "hour24": True}}
    for schema, instance in [
        (required, []),  # at least one call
        (required, [{"name": "get_date", "parameters": {}}]),  # only offered functions
        (required, [{"name": "get_time", "parameters": {"tz": "Mars", "hour24": True}}]),  # under their schema
        (one, [call, call]),  # parallel_tool_calls false: one call
        (named, call),  # a named function: its arguments alone
    ]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(instance, schema)


@pytest.mark.parametrize("text", ['[{"name": "get_weather", "parameters": {"city": "Pa', "[]", '[{"name": "nope"}]'])
def test_an_unfinished_or_wrong_array_is_content(text):
    """Cut by max_tokens (or not a call to an offered function): the text, as content."""
    parser = JsonArrayToolParser()
    assert parser.extract(text, NAMES).tool_calls == []
    content, _, is_tool_call = streamed(parser, text, 3)
    assert content == text and not is_tool_call


@pytest.mark.parametrize("parser", [JsonArrayToolParser(), make_tool_parser("hermes"), make_tool_parser("mistral")])
def test_a_tools_own_defs_reach_the_forced_calls_schema(parser):
    """Nested under a call, `#/$defs/Point` must still find its definition: the tools'
    $defs move to the constraint's root, for vLLM's JSON and for a format's own."""
    request = tool_request([PLACE, WEATHER], "required", None)
    assert request is not None
    constraint = forced_call_constraint(parser, request)
    check_constraint(StructuredOutputsParams(**constraint), StructuredOutputsLimits())
    call = {"name": "go_to", parser.argument_key: {"where": {"x": 3}}}
    jsonschema.validate([call] if isinstance(parser, JsonArrayToolParser) else call, constraint["json"])


def test_two_tools_defining_one_name_differently_are_a_400():
    other = json.loads(json.dumps(PLACE))
    other["function"]["name"] = "go_from"
    other["function"]["parameters"]["$defs"]["Point"] = {"type": "string"}
    request = tool_request([PLACE, other], "required", None)
    assert request is not None
    with pytest.raises(ApiError) as raised:
        forced_call_constraint(JsonArrayToolParser(), request)
    assert raised.value.status == 400 and raised.value.param == "tools" and "'Point'" in raised.value.message


# --- round trips on the random model -----------------------------------------------------------


@pytest.fixture(scope="module")
def plain_server(tiny_model):
    server = ServerThread(build_app(tiny_model)).start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        yield client
    finally:
        server.stop()


def ask(client, stream: bool, **kw):
    kw = {"max_tokens": 200, "temperature": 1.0, "tools": TOOLS, **kw}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    response = client.chat.completions.create(model=MODEL_NAME, messages=messages, stream=stream, **kw)
    if not stream:
        choice = response.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        assert all(c.id.startswith("call_") and c.type == "function" for c in choice.message.tool_calls or [])
        return choice.message.content, calls, choice.finish_reason
    content, calls, finish = "", {}, None
    for chunk in response:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                name, arguments = calls.get(d.index, (None, ""))
                if d.id:
                    assert name is None and d.function.name and d.type == "function", "announced once"
                    name = d.function.name
                calls[d.index] = (name, arguments + (d.function.arguments or ""))
            finish = choice.finish_reason or finish
    return content or None, [calls[k] for k in sorted(calls)], finish


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [None, False])
def test_required_with_a_plain_template_returns_valid_calls(plain_server, parallel):
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    for seed in range(4):
        content, calls, finish = ask(plain_server, False, tool_choice="required", seed=seed, **extra)
        assert finish == "tool_calls" and content is None, (content, calls)
        assert calls and (parallel is None or len(calls) == 1)
        for name, arguments in calls:
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        assert ask(plain_server, True, tool_choice="required", seed=seed, **extra) == (None, calls, "tool_calls")


@pytest.mark.slow
def test_a_named_function_with_a_plain_template_is_called(plain_server):
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(3):
        content, calls, finish = ask(plain_server, False, tool_choice=named, seed=seed)
        assert (content, finish) == (None, "tool_calls") and [name for name, _ in calls] == ["get_time"]
        jsonschema.validate(json.loads(calls[0][1]), SCHEMAS["get_time"])
        assert ask(plain_server, True, tool_choice=named, seed=seed) == (None, calls, "tool_calls")
