"""The tool-call formats on recorded model output: whole (non-streaming) and fed a few
characters at a time (streaming), well-formed and malformed."""

from __future__ import annotations

import json

import pytest

from inferd.engine.server.tool_parsers import ToolCallStream, detect_tool_parser, make_tool_parser
from inferd.engine.server.tool_parsers.base import open_value_end, parse_object_spans

NAMES = ["get_weather", "get_time"]

# (parser, model output, expected content, expected [(name, arguments)])
WELL_FORMED = [
    # Qwen 2.5 Instruct
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        None,
        [("get_weather", '{"city": "Paris", "unit": "celsius"}')],
    ),
    (
        "hermes",
        "Let me check both.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_time", "arguments": {"tz": "Europe/Paris", "note": "a } and a \\" inside"}}\n</tool_call>',
        "Let me check both.",
        [("get_weather", '{"city": "Lyon"}'), ("get_time", '{"tz": "Europe/Paris", "note": "a } and a \\" inside"}')],
    ),
    # the model stopped right after the JSON, before the closing tag
    (
        "hermes",
        '<tool_call>\n{"name": "get_time", "arguments": {}}',
        None,
        [("get_time", "{}")],
    ),
    # Llama 3.1 Instruct: the bare JSON, or after <|python_tag|> (special tokens kept)
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "San Francisco, CA"}}',
        None,
        [("get_weather", '{"city": "San Francisco, CA"}')],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
        '{"name": "get_time", "arguments": {"tz": "UTC"}}',
        None,
        [("get_weather", '{"city": "Oslo"}'), ("get_time", '{"tz": "UTC"}')],
    ),
    # arguments written as a JSON string
    (
        "llama3_json",
        '{"name": "get_time", "parameters": "{\\"tz\\": \\"UTC\\"}"}',
        None,
        [("get_time", '{"tz": "UTC"}')],
    ),
    # Mistral 7B Instruct v0.3, special tokens kept: the end-of-sequence text ends it
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome"}}, '
        '{"name": "get_time", "arguments": {"tz": "CET"}}]</s>',
        None,
        [("get_weather", '{"city": "Rome"}'), ("get_time", '{"tz": "CET"}')],
    ),
    # Mistral's v11 tokenizers: name[ARGS]{...}
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Bern"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}</s>',
        None,
        [("get_weather", '{"city": "Bern"}'), ("get_time", '{"tz": "CET"}')],
    ),
]

# (parser, output) that must come back as plain content, unchanged
NOT_CALLS = [
    ("hermes", "The weather in Paris is sunny."),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),  # cut off
    ("hermes", '<tool_call>\n{"name": "get_weather" "arguments": {}}\n</tool_call>'),  # missing comma
    ("hermes", '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>'),  # not offered
    ("hermes", '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>'),  # no name
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>'),  # not an object
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {}}\nand then some</tool_call>'),
    ("llama3_json", '{"city": "Paris"} is what I would send.'),
    ("llama3_json", "I would call get_weather with Paris."),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": '),
    ("llama3_json", "{"),
    ("mistral", "[TOOL_CALLS] [{'name': 'get_weather'}]"),  # Python, not JSON
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {}}'),  # the list never closes
    ("mistral", "[TOOL_CALLS]"),
]


@pytest.mark.parametrize("parser_name, text, content, calls", WELL_FORMED)
def test_whole_output_parses(parser_name, text, content, calls):
    parser = make_tool_parser(parser_name, "</s>")
    found = parser.extract(text, NAMES)
    assert found.content == content
    assert [(c.name, c.arguments) for c in found.tool_calls] == calls
    for call in found.tool_calls:
        body = call.to_openai()
        assert body["type"] == "function" and body["id"].startswith("call_") and len(body["id"]) > 8
        assert isinstance(json.loads(body["function"]["arguments"]), dict)
    assert len({c.id for c in found.tool_calls}) == len(calls)


@pytest.mark.parametrize("parser_name, text", NOT_CALLS)
def test_malformed_output_is_content(parser_name, text):
    found = make_tool_parser(parser_name).extract(text, NAMES)
    assert found.tool_calls == []
    assert found.content == text


def test_mistral_content_drops_the_end_of_sequence_text():
    found = make_tool_parser("mistral", "</s>").extract("Sunny, 24 degrees.</s>", NAMES)
    assert found.content == "Sunny, 24 degrees." and not found.tool_calls


def stream(parser_name: str, text: str, step: int, max_calls: int = 0):
    """Feed `text` `step` characters at a time; the content, the calls rebuilt from the
    deltas as the openai client does, the deltas, and whether it ended as tool calls."""
    s = ToolCallStream(make_tool_parser(parser_name, "</s>"), NAMES, max_calls)
    content, deltas = "", []
    calls: dict[int, dict] = {}
    ends = list(range(step, len(text), step)) + [len(text)]
    for end in ends:
        update = s.update(text[:end], end == len(text))
        content += update.content
        for d in update.tool_calls:
            deltas.append(d)
            call = calls.setdefault(d["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in d:
                assert call["id"] is None, "a call is announced once"
                assert d["function"]["name"] and d["type"] == "function"
                call["id"], call["name"] = d["id"], d["function"]["name"]
            else:
                assert call["id"] is not None, "the name comes before the arguments"
            call["arguments"] += d["function"]["arguments"]
    return content, [calls[k] for k in sorted(calls)], deltas, update.is_tool_call


@pytest.mark.parametrize("step", [1, 3, 17, 10_000])
@pytest.mark.parametrize("parser_name, text, content, calls", WELL_FORMED)
def test_stream_sends_the_same_calls(parser_name, text, content, calls, step):
    got_content, got_calls, deltas, is_tool_call = stream(parser_name, text, step)
    assert is_tool_call
    assert (got_content.strip() or None) == content
    assert [(c["name"], c["arguments"]) for c in got_calls] == calls
    if step == 1 and '"{' not in text:  # character by character, object arguments arrive in fragments
        fragments = [d for d in deltas if d["index"] == 0 and "id" not in d]
        assert len(fragments) > 1


@pytest.mark.parametrize("step", [1, 5, 10_000])
@pytest.mark.parametrize("parser_name, text", NOT_CALLS)
def test_stream_of_malformed_output_is_all_content(parser_name, text, step):
    got_content, got_calls, _, is_tool_call = stream(parser_name, text, step)
    # A call may have been announced from its name before the rest went bad; the choice
    # then does not finish as tool_calls, and its whole text arrives as content.
    assert not is_tool_call
    assert got_content == text
    assert all(c["name"] == "get_weather" for c in got_calls)


def test_plain_content_streams_as_it_comes():
    s = ToolCallStream(make_tool_parser("hermes"), NAMES)
    assert s.update("Hello", False).content == "Hello"
    assert s.update("Hello, wor", False).content == ", wor"
    # a tail that may open a tool call waits
    assert s.update("Hello, world <tool", False).content == "ld "
    assert s.update("Hello, world <tool>", False).content == "<tool>"
    assert s.update("Hello, world <tool>!", True).content == "!"


def test_parallel_tool_calls_false_sends_one_call():
    text = WELL_FORMED[1][1]
    _, calls, _, _ = stream("hermes", text, 4, max_calls=1)
    assert [c["name"] for c in calls] == ["get_weather"]


def test_json_scanning():
    fields, end = parse_object_spans('  {"a": {"b": [1, "}"]}, "c": 2} tail', 0)
    assert end == len('  {"a": {"b": [1, "}"]}, "c": 2}')
    assert fields["a"][0] == {"b": [1, "}"]} and fields["c"][0] == 2
    with pytest.raises(ValueError):
        parse_object_spans('{"a": 1', 0)
    assert open_value_end('{"x": "]}"} more', 0) == len('{"x": "]}"}')
    assert open_value_end('{"x": ["', 0) is None


@pytest.mark.parametrize(
    "template, expected",
    [
        ("{% for m in messages %}<tool_call>{% endfor %}", "hermes"),
        ("[INST] {{ m }} [/INST][TOOL_CALLS]", "mistral"),
        ("<|start_header_id|>{{ m }}<|python_tag|>", "llama3_json"),
        ("<|start_header_id|>{% if tools %}{% endif %}", "llama3_json"),
        ("<|start_header_id|>{{ message['content'] }}<|eot_id|>", None),
        (None, None),
    ],
)
def test_detect_from_chat_template(template, expected):
    assert detect_tool_parser(template) == expected


def test_unknown_parser_name():
    with pytest.raises(ValueError, match="llama3_json"):
        make_tool_parser("pythonic")


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]


@pytest.mark.parametrize("parser_name", ["llama3_json", "hermes", "mistral"])
def test_a_forced_call_in_the_constraint_shape_parses(parser_name):
    """What a forced call is generated as (the format's text, then JSON valid under the
    call schema, then the format's closing text) parses back as that call."""
    import jsonschema

    from inferd.engine.server.tool_parsers.tool_choice import forced_call_constraint, tool_request

    parser = make_tool_parser(parser_name, "</s>")
    for choice, instance in [
        ("required", {"name": "get_weather", parser.argument_key: {"city": "Paris"}}),
        ("required", {"name": "get_time", parser.argument_key: {}}),
        ({"type": "function", "function": {"name": "get_time"}}, {"name": "get_time", parser.argument_key: {}}),
    ]:
        request = tool_request(TOOLS, choice, None)
        assert request is not None and request.is_forced
        constraint = forced_call_constraint(parser, request)
        jsonschema.validate(instance, constraint["json"])
        text = constraint["before"] + json.dumps(instance) + constraint["after"]
        (call,) = parser.extract(text, request.names).tool_calls
        assert call.name == instance["name"]
        assert json.loads(call.arguments) == instance[parser.argument_key]
    named = forced_call_constraint(
        parser, tool_request(TOOLS, {"type": "function", "function": {"name": "get_time"}}, None)
    )  # type: ignore[arg-type]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", parser.argument_key: {"city": "Paris"}}, named["json"])
