"""Bad input: each case gets its OpenAI-style error with the right status and a message
naming the problem; none is a 5xx and none disturbs the requests around it."""

from __future__ import annotations

import json
import socket

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from server_fixtures import MODEL_NAME, admin_headers, assert_error, metric_value, running_server, scrape

MAX_MODEL_LEN = 128
MAX_BODY = 4096


@pytest.fixture(scope="module")
def server(tiny_model):
    with running_server(tiny_model, max_model_len=MAX_MODEL_LEN, max_body_bytes=MAX_BODY) as s:
        yield s


def post(server, path: str, body=None, content: bytes | None = None, headers=None) -> httpx.Response:
    if content is not None:
        return httpx.post(
            f"{server.url}{path}",
            content=content,
            timeout=30,
            headers={"content-type": "application/json", **(headers or {})},
        )
    return httpx.post(f"{server.url}{path}", json=body, timeout=30, headers=headers)


def completion(**overrides):
    return {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4, **overrides}


LONG_PROMPT = "hello " * 400  # far more than MAX_MODEL_LEN tokens


@pytest.mark.parametrize(
    "body, fragments, param",
    [
        (completion(prompt=LONG_PROMPT[:1500]), ["max_model_len is 128"], "prompt"),
        (completion(max_tokens=MAX_MODEL_LEN), ["maximum context length is 128"], "max_tokens"),
        (completion(temperature=-1), ["temperature must be >= 0"], "temperature"),
        (completion(prompt=["a"] * 5, n=60), ["would start 300 sequences (5 prompt(s) x n=60); at most 256"], "n"),
        (completion(top_p=1.5), ["top_p must be in (0, 1]"], "top_p"),
        (completion(n=0), ["n must be in"], "n"),
        (completion(max_tokens=0), ["max_tokens must be an integer >= 1"], "max_tokens"),
        (completion(logprobs=21), ["logprobs must be in"], "logprobs"),
        (completion(presence_penalty=3), ["presence_penalty must be in"], "presence_penalty"),
        (completion(prompt=""), ["prompt is empty"], "prompt"),
        (completion(prompt=[1, 2, 999999]), ["unknown token id"], "prompt"),
        (completion(stream_options={"include_usage": True}), ["stream_options is only allowed"], "stream_options"),
        (completion(use_beam_search=True), ["use_beam_search is not supported"], "use_beam_search"),
        (completion(logit_bias={"5": 101}), ["must be a number in [-100, 100]"], "logit_bias"),
        (completion(echo=True, max_tokens=0, prompt_logprobs=21), ["prompt_logprobs must be in"], "prompt_logprobs"),
        (completion(repetition_penalty=1e-300), ["repetition_penalty must be in [0.01, 100.0]"], "repetition_penalty"),
    ],
)
def test_completion_400(server, body, fragments, param):
    assert_error(post(server, "/v1/completions", body), 400, *fragments, param=param)


@pytest.mark.parametrize(
    "body, fragments, param",
    [
        ({"model": MODEL_NAME, "messages": []}, ["at least one message"], "messages"),
        (
            {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
            ["top_logprobs needs logprobs"],
            "top_logprobs",
        ),
        (
            {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 1000},
            ["maximum context length is 128"],
            "max_completion_tokens",
        ),
        (
            {"model": MODEL_NAME, "messages": [{"role": "user", "content": LONG_PROMPT[:1500]}]},
            ["max_model_len is 128"],
            "messages",
        ),
        (
            {"model": MODEL_NAME, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            ["only text parts are supported"],
            None,
        ),
        (
            {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
            ["tools[0].function must be an object"],
            "tools[0].function",
        ),
        (
            {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}, {"role": "wizard", "content": "x"}]},
            ["messages[1].role must be one of system, developer, user, assistant, tool, function; got 'wizard'"],
            "messages[1].role",
        ),
    ],
)
def test_chat_400(server, body, fragments, param):
    assert_error(post(server, "/v1/chat/completions", body), 400, *fragments, param=param)


def test_unknown_model_404(server):
    error = assert_error(
        post(server, "/v1/completions", completion(model="gpt-9")),
        404,
        "The model `gpt-9` does not exist",
        param="model",
    )
    assert error["code"] == "model_not_found"
    assert_error(
        post(server, "/v1/chat/completions", {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}),
        404,
        "does not exist",
    )


def test_body_too_large_413(server):
    big = completion(prompt="x" * (MAX_BODY + 100))
    assert_error(post(server, "/v1/completions", big), 413, f"limit of {MAX_BODY} bytes")

    # Without a Content-Length header (chunked upload) the limit holds too.
    def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    r = httpx.post(f"{server.url}/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert_error(r, 413, "larger than the limit")


def _read_response(reader) -> tuple[int, bytes]:
    status = int(reader.readline().split()[1])
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, reader.read(length)


def _ten_megabyte_request(chunked: bool) -> bytes:
    body = b"x" * (10 << 20)
    if not chunked:
        return b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    step = 1 << 16
    chunks = b"".join(b"%x\r\n%s\r\n" % (step, body[i : i + step]) for i in range(0, len(body), step))
    return b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
def test_413_reaches_a_client_whose_connection_already_carried_a_request(server, chunked):
    # A client that writes its whole body before reading (most do) must not meet a reset.
    big = _ten_megabyte_request(chunked)
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn, conn.makefile("rb") as reader:
            conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n")
            assert _read_response(reader)[0] == 200
            conn.sendall(big)
            status, body = _read_response(reader)
            assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
            assert reader.read() == b""  # then the server closes the connection


@pytest.mark.parametrize(
    "content, fragments, param, code",
    [
        (b"{not json", ["not valid JSON"], None, "invalid_json"),
        (b'{"model": "tiny", "prompt": "hi", "max_tokens": "ten"}', ["max_tokens"], "max_tokens", "invalid_type"),
        (b'{"model": "tiny", "max_tokens": 3}', ["prompt", "Field required"], "prompt", "missing_required_parameter"),
        (
            b'{"model": "tiny", "prompt": {"a": 1}}',
            ["prompt: Input should be a valid string"],
            "prompt",
            "invalid_type",
        ),
        (b'{"model": "tiny", "prompt": "hi", "stop": ["a", 7]}', ["stop[1]"], "stop", "invalid_type"),
        (b'{"model": "tiny", "prompt": "hi", "stream": "yes"}', ["stream"], "stream", "invalid_type"),
        (b"[1, 2, 3]", ["body: "], None, "invalid_type"),
        (b'{"model": "tiny", "prompt": "hi", "temperature": NaN}', ["temperature", "finite"], "temperature", None),
        (b'{"model": "tiny", "prompt": "hi", "top_p": Infinity}', ["top_p", "finite"], "top_p", None),
    ],
)
def test_malformed_bodies_are_400_naming_the_field(server, content, fragments, param, code):
    """As OpenAI and vLLM answer them: 400, not FastAPI's 422."""
    error = assert_error(post(server, "/v1/completions", content=content), 400, *fragments, param=param)
    assert error["type"] == "invalid_request_error"
    if code is not None:
        assert error["code"] == code


def chat(**overrides):
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **overrides}


def raw(body: dict) -> bytes:
    # json.dumps writes a lone surrogate as the \\ud800 escape: valid JSON, but not valid Unicode text.
    return json.dumps(body).encode()


SURROGATE = "\ud800"


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", completion(prompt=f"ab{SURROGATE}cd"), "prompt"),
        ("/v1/completions", completion(prompt=["fine", SURROGATE]), "prompt[1]"),
        ("/v1/completions", completion(model=SURROGATE), "model"),
        ("/v1/completions", completion(stop=["ok", SURROGATE]), "stop[1]"),
        ("/v1/completions", completion(user=SURROGATE), "user"),
        ("/v1/chat/completions", chat(messages=[{"role": "user", "content": f"a{SURROGATE}"}]), "messages[0].content"),
        ("/v1/chat/completions", chat(messages=[{"role": SURROGATE, "content": "a"}]), "messages[0].role"),
        (
            "/v1/chat/completions",
            chat(messages=[{"role": "user", "content": "a", "name": SURROGATE}]),
            "messages[0].name",
        ),
        (
            "/v1/chat/completions",
            chat(messages=[{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]),
            "messages[0].content[0].text",
        ),
        ("/v1/chat/completions", chat(model=SURROGATE), "model"),
        ("/v1/chat/completions", chat(metadata={"k": SURROGATE}), "metadata.k"),
    ],
)
def test_lone_surrogates_get_400_naming_the_field(server, path, body, param):
    error = assert_error(post(server, path, content=raw(body)), 400, "not valid Unicode text", param=param)
    assert error["code"] == "invalid_encoding"


def test_error_messages_quoting_client_text_still_render(server):
    # An unknown argument's name is quoted in the message; a surrogate in it must not break the answer.
    r = post(server, "/v1/completions", content=raw(completion(**{f"x{SURROGATE}": 1})))
    assert 400 <= r.status_code < 500, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


NOT_UTF8 = b'{"model": "tiny", "prompt": "\xff\xfe"}'
DEEP = b"[" * 2000 + b"]" * 2000  # under the body limit, past the JSON parser's nesting limit
DEEPER = b"[" * 10000 + b"]" * 10000  # over this server's body limit


@pytest.mark.parametrize(
    "path, method, headers",
    [
        ("/v1/completions", "POST", {}),
        ("/v1/chat/completions", "POST", {}),
        ("/admin/config", "PATCH", admin_headers()),
    ],
)
@pytest.mark.parametrize(
    "content, fragment",
    [
        (NOT_UTF8, "not valid UTF-8: byte 0xff at position"),
        (DEEP, "nests too deeply"),
        (DEEPER, ""),
        (
            b'{"prompt": "hi",, }',
            "request body is not valid JSON: Expecting property name enclosed in double quotes at position 16",
        ),
    ],
)
def test_unparsable_bodies_get_4xx_in_the_openai_shape(server, path, method, headers, content, fragment):
    r = httpx.request(
        method,
        f"{server.url}{path}",
        content=content,
        timeout=30,
        headers={"content-type": "application/json", **headers},
    )
    assert r.status_code in (400, 413, 422), r.text
    error = assert_error(r, r.status_code, fragment)
    if r.status_code != 413:
        assert error["param"] is None


def test_hostile_input_leaves_the_server_working(server):
    for content in (raw(completion(prompt=SURROGATE)), NOT_UTF8, DEEP):
        post(server, "/v1/completions", content=content)
    r = post(server, "/v1/completions", completion())
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1
    with pytest.raises(KeyError):
        metric_value(scrape(server.url), "http_requests_total", {"status": "5xx"})


def http_series(text: str) -> set[tuple]:
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "http_requests"]
    return {tuple(sorted(s.labels.items())) for s in family.samples if s.name == "http_requests_total"}


def test_made_up_methods_and_paths_fold_into_other(server):
    scrape(server.url)  # the first scrape adds /metrics' own series, whatever ran before this test
    before = http_series(scrape(server.url))
    for i in range(50):
        httpx.request(f"FOO{i}", f"{server.url}/v1/completions", timeout=10)
        httpx.get(f"{server.url}/no/such/path/{i}", timeout=10)
    added = http_series(scrape(server.url)) - before
    assert len(added) <= 2, added  # at most {method="other"} on the route and GET on handler "other"
    assert all(dict(labels)["method"] in ("other", "GET") for labels in added), added
    assert all(dict(labels)["handler"] in ("/v1/completions", "other") for labels in added), added


def test_chat_malformed_bodies_are_400_naming_the_field(server):
    r = post(server, "/v1/chat/completions", {"model": MODEL_NAME, "messages": "hi"})
    assert_error(r, 400, "messages: Input should be a valid list", param="messages")
    r = post(server, "/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user"}, {"content": "hi"}]})
    error = assert_error(r, 400, "messages[1].role: Field required", param="messages[1].role")
    assert error["code"] == "missing_required_parameter"
    r = post(server, "/v1/chat/completions", chat(parallel_tool_calls="yes"))
    assert_error(r, 400, "parallel_tool_calls", param="parallel_tool_calls")


def test_openai_client_raises_bad_request_for_a_wrong_type(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens="ten")  # type: ignore[arg-type]


def test_openai_client_raises_its_usual_errors(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="temperature must be"):
        client.completions.create(model=MODEL_NAME, prompt="hi", temperature=-2)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="hi")


def test_min_tokens_without_max_tokens(server):
    # No max_tokens: the rest of the context is the limit, and min_tokens is checked against it.
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "min_tokens": 3}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert 3 <= usage["completion_tokens"] <= MAX_MODEL_LEN - usage["prompt_tokens"]
    r = post(server, "/v1/completions", completion(min_tokens=3, max_tokens=2))
    assert_error(r, 400, "min_tokens must be in [0, 2]", param="min_tokens")


def test_tiny_temperature_is_raised_not_fatal(server):
    r = post(server, "/v1/completions", completion(temperature=1e-300, max_tokens=4))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


def test_mistakes_never_5xx_and_never_disturb_others(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    before = client.completions.create(model=MODEL_NAME, prompt="Hello there", max_tokens=8, temperature=0)
    for body in (completion(temperature=-1), completion(prompt=LONG_PROMPT[:1500]), completion(model="x")):
        assert 400 <= post(server, "/v1/completions", body).status_code < 500
    post(server, "/v1/completions", content=b"{oops")
    after = client.completions.create(model=MODEL_NAME, prompt="Hello there", max_tokens=8, temperature=0)
    assert after.choices[0].text == before.choices[0].text
    text = scrape(server.url)
    assert metric_value(text, "http_requests_total", {"status": "4xx"}) >= 4
    with pytest.raises(KeyError):
        metric_value(text, "http_requests_total", {"status": "5xx"})


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-5, max_value=600), max_size=4),
    st.lists(st.text(max_size=4), max_size=3),
)
FIELDS = [
    "prompt",
    "max_tokens",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
    "ignore_eos",
    "priority",
    "stream",
]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=6))
def test_random_parameters_never_5xx(server, fields):
    body = {"model": MODEL_NAME, "prompt": "Hello world", "max_tokens": 3, **fields}
    if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 8:
        body["max_tokens"] = 8  # keep examples quick; the value's validity is not what is tested
    if isinstance(body.get("n"), int) and body["n"] > 4:
        body["n"] = 4
    r = post(server, "/v1/completions", body)
    assert r.status_code < 500, (body, r.status_code, r.text)
    if r.status_code >= 400:
        assert r.json()["error"]["message"]


def test_server_healthy_after_fuzzing(server):
    assert httpx.get(f"{server.url}/health").status_code == 200
    with pytest.raises(KeyError):
        metric_value(scrape(server.url), "http_requests_total", {"status": "5xx"})


# --- X-Request-Id -------------------------------------------------------------------------------


def test_request_id_is_the_body_id_when_the_client_sends_none(server):
    r = post(server, "/v1/completions", completion())
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == r.json()["id"] and r.json()["id"].startswith("cmpl-")
    r = post(server, "/v1/chat/completions", chat())
    assert r.headers["x-request-id"] == r.json()["id"] and r.json()["id"].startswith("chatcmpl-")
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=chat(stream=True), timeout=30) as r:
        first = json.loads(next(r.iter_lines()).removeprefix("data: "))
        assert r.headers["x-request-id"] == first["id"]


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "/v1/completions", completion()),
        ("POST", "/v1/chat/completions", chat(stream=True)),
        ("POST", "/v1/completions", completion(temperature=-1)),  # 400 from the route
        ("POST", "/v1/completions", {"prompt": 1.5}),  # 400 from validation
        ("POST", "/v1/completions", completion(prompt="x" * (MAX_BODY + 100))),  # 413 before routing
        ("GET", "/v1/models", None),
        ("GET", "/v1/models/nope", None),
        ("POST", "/tokenize", {"prompt": "hi"}),
        ("GET", "/no/such/route", None),
    ],
)
def test_a_clients_request_id_comes_back_on_every_response(server, method, path, body):
    sent = "3f2b9c1e-7d4a-4e8b-9a6f-0c5d2e1b8a77"
    r = httpx.request(method, f"{server.url}{path}", json=body, headers={"X-Request-Id": sent}, timeout=30)
    assert r.headers.get_list("x-request-id") == [sent], (r.status_code, r.text)


@pytest.mark.parametrize("sent", ["x" * 129, "two words", "tab\there", ""])
def test_a_malformed_request_id_is_replaced_by_the_servers_own(server, sent):
    r = post(server, "/v1/completions", completion(), headers={"X-Request-Id": sent})
    assert r.status_code == 200, r.text  # a tracing header never fails the request
    assert r.headers["x-request-id"] == r.json()["id"]


def test_errors_before_a_request_id_is_made_get_a_fresh_one(server):
    r = post(server, "/v1/completions", {"prompt": 1.5})
    assert r.status_code == 400
    first = r.headers["x-request-id"]
    second = post(server, "/v1/completions", {"prompt": 1.5}).headers["x-request-id"]
    assert first.startswith("req-") and second.startswith("req-") and first != second
