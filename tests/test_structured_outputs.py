"""Structured outputs and logit_bias.

Engine level: the parameters' validation, the grammar mask and the bias applied to the
logits by the sampler (a constrained row draws only allowed tokens, an unconstrained row
in the same batch is untouched), constrained rows leaving the fused greedy path, and a
request whose grammar is still compiling waiting while the others run.

Through the server with the official `openai` client on a random checkpoint: every
output for a set of JSON schemas (nested objects, enums, arrays, required fields)
parses and validates with `jsonschema`, on chat (`response_format` json_schema,
`chat.completions.parse` with a pydantic model) and completions (vLLM's `guided_json`
and `structured_outputs`); regex, choice, grammar and json_object likewise; constrained
and unconstrained requests at once; logit_bias +100 forces a token and -100 bans it; an
invalid schema, regex, grammar or bias is a 400 naming the field.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import jsonschema
import openai
import pydantic
import pytest
import torch

from inferd.engine import LLM, SamplingParams
from inferd.engine.request.sequence import Sequence
from inferd.engine.sampling.greedy import plain_greedy
from inferd.engine.sampling.sampler import sample
from inferd.engine.structured_outputs.compiler import GrammarCompiler
from inferd.engine.structured_outputs.grammar import StructuredOutputs, TokenMask, build_grammar
from inferd.engine.structured_outputs.params import StructuredOutputsParams, check_logit_bias
from inferd.engine.text.tokenizer import Tokenizer

from server_fixtures import MODEL_NAME, running_server

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
SCHEMAS = {
    "flat": PERSON,
    "nested": {
        "type": "object",
        "properties": {
            "owner": PERSON,
            "address": {
                "type": "object",
                "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "main": {"type": "boolean"}},
                "required": ["zip", "main"],
                "additionalProperties": False,
            },
        },
        "required": ["owner", "address"],
        "additionalProperties": False,
    },
    "arrays": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
            "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 4},
            "note": {"type": ["string", "null"], "maxLength": 4},
        },
        "required": ["tags", "scores"],
        "additionalProperties": False,
    },
}
MAX_TOKENS = 120  # well past the longest output these schemas allow in the tiny vocabulary


@pytest.fixture(scope="module")
def model_dir(model_factory) -> str:
    return model_factory(preset="tiny", seed=23)


# --- parameters -------------------------------------------------------------------------


def test_params_need_exactly_one_constraint():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="regex, choice"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="json is not valid JSON"):
        StructuredOutputsParams(json="{not json")
    with pytest.raises(ValueError, match="before/after"):
        StructuredOutputsParams(regex="a", before="<x>")
    with pytest.raises(ValueError, match="choice"):
        StructuredOutputsParams(choice=[])
    assert StructuredOutputsParams(json='{"type": "object"}').kind == "json"
    assert StructuredOutputsParams(json_object=True).kind == "json_object"


def test_logit_bias_checked():
    assert check_logit_bias({"5": 100, 7: -100.0}) == {5: 100.0, 7: -100.0}
    for bad, match in [({"x": 1}, "not a token id"), ({"5": 101}, r"\[-100, 100\]"), ({"-1": 1}, "token id")]:
        with pytest.raises(ValueError, match=match):
            check_logit_bias(bad)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        check_logit_bias({"10": 1}, vocab_size=10)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={"1": True})


@pytest.mark.parametrize(
    "params, field",
    [
        (StructuredOutputsParams(regex="a("), "regex"),
        (StructuredOutputsParams(json={"type": "nope"}), "json"),
        (StructuredOutputsParams(grammar="root ::= "), "grammar"),
    ],
)
def test_invalid_grammar_names_its_field(params, field):
    with pytest.raises(ValueError, match=rf"^structured_outputs\.{field} is invalid: \S"):
        build_grammar(params)


def test_bounded_strings_refuse_control_characters(model_dir):
    import xgrammar as xgr

    from inferd.engine.structured_outputs.grammar import tokenizer_info

    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 4}}, "required": ["s"]}
    compiler = xgr.GrammarCompiler(tokenizer_info(Tokenizer(model_dir), 512))
    compiled = compiler.compile_grammar(build_grammar(StructuredOutputsParams(json=schema)))
    assert xgr.GrammarMatcher(compiled).accept_string('{"s": "ab')
    assert not xgr.GrammarMatcher(compiled).accept_string('{"s": "a\x01')  # json.loads refuses it
    assert not xgr.GrammarMatcher(compiled).accept_string('{"s": "abcde')  # maxLength still holds


# --- the sampler --------------------------------------------------------------------------


def _seqs(params_list: list[SamplingParams]) -> list[Sequence]:
    return [Sequence(f"r{i}", 0, [1, 2, 3], p, 0, 0.0, 0) for i, p in enumerate(params_list)]


def test_mask_applies_to_its_rows_only(model_dir):
    tok = Tokenizer(model_dir, [1])
    constrained = SamplingParams(temperature=1.0, structured_outputs=StructuredOutputsParams(choice=["cat", "dog"]))
    free = SamplingParams(temperature=0.0)
    seqs = _seqs([free, constrained, free])
    so = StructuredOutputs(tok, 512, torch.device("cpu"))
    so.hold("r1", [seqs[1]], constrained.structured_outputs)
    so.compile(constrained.structured_outputs).result(timeout=60)
    ready, failed = so.take_ready()
    assert ready == [seqs[1]] and not failed
    texts = {t: tok.decode([t]) for t in range(512)}
    allowed = {t for t, text in texts.items() if text and ("cat".startswith(text) or "dog".startswith(text))}
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 512, generator=gen) * 4
    logits[1] = 0.0  # uniform: the draw is over exactly the allowed tokens
    drawn = set()
    for step in range(30):
        mask = so.fill(seqs)
        assert isinstance(mask, TokenMask) and mask.rows == [1]
        tokens, _ = sample(logits.clone(), seqs, [1], step, mask=mask)
        assert tokens[0] == int(logits[0].argmax()) and tokens[2] == int(logits[2].argmax())
        assert tokens[1] in allowed, texts[tokens[1]]
        drawn.add(tokens[1])
    assert len(drawn) > 1  # a draw among the allowed tokens, not one forced token
    so.close()


def test_unconstrained_steps_need_no_xgrammar(model_dir, monkeypatch):
    """An engine whose requests carry no grammar samples without xgrammar installed (the
    GPU images may lack it): only a constrained row imports it."""
    import sys

    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar now raises ImportError
    so = StructuredOutputs(Tokenizer(model_dir, [1]), 512, torch.device("cpu"))
    assert so.fill(_seqs([SamplingParams(temperature=1.0), SamplingParams(temperature=0.0)])) is None
    so.close()


def test_choice_generation_ends_with_the_grammar(model_dir):
    llm = LLM(model_dir, device="cpu")
    choices = ["alpha", "beta", "gamma delta"]
    params = SamplingParams(
        n=4, max_tokens=30, temperature=1.0, seed=3, structured_outputs=StructuredOutputsParams(choice=choices)
    )
    out = llm.generate(["pick one"], params)[0]
    assert [o.text in choices for o in out.outputs] == [True] * 4
    assert {o.finish_reason for o in out.outputs} == {"stop"}


def test_logit_bias_forces_and_bans():
    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    forced = (int(logits[0].argmax()) + 5) % 64
    first, second = logits[1].topk(2).indices.tolist()
    seqs = _seqs(
        [
            SamplingParams(temperature=1.0, logit_bias={forced: 100.0}),
            SamplingParams(temperature=0.0, logit_bias={first: -100.0}),
        ]
    )
    for step in range(20):
        tokens, _ = sample(logits.clone(), seqs, [1], step)
        assert tokens == [forced, second]


def test_constrained_and_biased_rows_leave_the_greedy_fast_path():
    greedy = SamplingParams(temperature=0.0)
    assert plain_greedy(_seqs([greedy])[0])
    so = SamplingParams(temperature=0.0, structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    biased = SamplingParams(temperature=0.0, logit_bias={3: 1.0})
    assert not plain_greedy(_seqs([so])[0])
    assert not plain_greedy(_seqs([biased])[0])


def test_request_waits_for_its_grammar_while_others_run(model_dir, monkeypatch):
    llm = LLM(model_dir, device="cpu")
    engine = llm.engine
    release = threading.Event()
    compile_real = GrammarCompiler._compile_on

    def slow_compile(self, worker, job):
        assert release.wait(60)
        return compile_real(self, worker, job)

    monkeypatch.setattr(GrammarCompiler, "_compile_on", slow_compile)
    engine.add_request("free", "hello", SamplingParams(max_tokens=4, temperature=0.0))
    engine.add_request(
        "json", "hello", SamplingParams(max_tokens=MAX_TOKENS, structured_outputs=StructuredOutputsParams(json=PERSON))
    )
    finished: dict[str, str] = {}
    for _ in range(10):  # the free request finishes while the grammar is still compiling
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].text
    assert "free" in finished and "json" not in finished
    assert engine.structured.num_held == 1
    release.set()
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].text
    jsonschema.validate(json.loads(finished["json"]), PERSON)


def test_constrained_and_free_rows_in_one_step(model_dir):
    engine = LLM(model_dir, device="cpu").engine
    so = StructuredOutputsParams(json=PERSON)
    engine.structured.compile(so).result(timeout=60)  # compiled: the request joins at once
    engine.add_request("free", "hello", SamplingParams(max_tokens=20, ignore_eos=True, temperature=1.0, seed=1))
    engine.add_request(
        "json", "hello", SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=2, structured_outputs=so)
    )
    together, texts = 0, {}
    while engine.has_unfinished():
        outputs = engine.step()
        together += {o.request_id for o in outputs} == {"free", "json"}
        texts.update({o.request_id: o.outputs[0].text for o in outputs if o.finished})
    assert together >= 5  # both drew a token in the same steps
    jsonschema.validate(json.loads(texts["json"]), PERSON)


# --- through the server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(model_dir):
    with running_server(model_dir, device="cpu") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def _chat(client, **kwargs):
    return client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Give me JSON."}], max_tokens=MAX_TOKENS, **kwargs
    )


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_outputs_validate(client, name):
    schema = SCHEMAS[name]
    response = _chat(
        client,
        n=4,
        temperature=1.0,
        seed=7,
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
    )
    assert len(response.choices) == 4
    for choice in response.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)


@pytest.mark.parametrize("field", ["guided_json", "structured_outputs"])
def test_completions_json_extras_validate(client, field):
    schema = SCHEMAS["nested"]
    extra = {"guided_json": schema} if field == "guided_json" else {"structured_outputs": {"json": schema}}
    response = client.completions.create(
        model=MODEL_NAME, prompt="JSON:", max_tokens=MAX_TOKENS, n=3, temperature=1.0, seed=11, extra_body=extra
    )
    for choice in response.choices:
        jsonschema.validate(json.loads(choice.text), schema)


def test_streamed_json_schema_validates(client):
    schema = SCHEMAS["arrays"]
    stream = _chat(
        client,
        stream=True,
        temperature=1.0,
        seed=9,
        response_format={"type": "json_schema", "json_schema": {"name": "arrays", "schema": schema}},
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), schema)


def test_grammar_cache_is_bounded(model_dir, monkeypatch):
    from inferd.engine.structured_outputs import grammar as structured_outputs_grammar

    monkeypatch.setattr(structured_outputs_grammar, "MAX_CACHED_GRAMMARS", 2)
    so = StructuredOutputs(Tokenizer(model_dir), 512, torch.device("cpu"))
    first = so.compile(StructuredOutputsParams(regex="a"))
    assert so.compile(StructuredOutputsParams(regex="a")) is first  # cached
    for regex in ("b", "c"):
        so.compile(StructuredOutputsParams(regex=regex)).result(timeout=60)
    assert so.compile(StructuredOutputsParams(regex="a")) is not first  # evicted, compiled again
    so.close()


def test_parse_with_a_pydantic_model(client):
    class Pet(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=5)
        kind: str = pydantic.Field(pattern="^(cat|dog)$")
        legs: int = pydantic.Field(ge=0, le=8)

    completion = client.chat.completions.parse(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "A pet."}],
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        seed=5,
        response_format=Pet,
    )
    pet = completion.choices[0].message.parsed
    assert isinstance(pet, Pet) and pet.kind in ("cat", "dog") and 0 <= pet.legs <= 8


@pytest.mark.parametrize(
    "extra, check",
    [
        ({"guided_regex": r"[a-c]{3}-[0-9]{2}"}, lambda t: re.fullmatch(r"[a-c]{3}-[0-9]{2}", t)),
        ({"structured_outputs": {"regex": r"(yes|no)!"}}, lambda t: t in ("yes!", "no!")),
        ({"guided_choice": ["red", "green", "blue"]}, lambda t: t in ("red", "green", "blue")),
        ({"structured_outputs": {"choice": ["left", "right"]}}, lambda t: t in ("left", "right")),
        ({"guided_grammar": 'root ::= "(" [0-9] ("+" [0-9])? ")"'}, lambda t: re.fullmatch(r"\([0-9](\+[0-9])?\)", t)),
    ],
    ids=["guided_regex", "so_regex", "guided_choice", "so_choice", "guided_grammar"],
)
def test_regex_choice_grammar(client, extra, check):
    response = client.completions.create(
        model=MODEL_NAME, prompt="Answer:", max_tokens=20, n=4, temperature=1.0, seed=2, extra_body=extra
    )
    for choice in response.choices:
        assert check(choice.text), choice.text
        assert choice.finish_reason == "stop"


def test_json_object(client, model_dir):
    # A random model rarely closes a free-form object or string on its own: a bias on "}"
    # and '"' lets it finish within max_tokens; the grammar still decides where they go.
    tok = Tokenizer(model_dir)
    bias = {}
    for text in ("}", '"'):
        ids = tok.encode(text, add_special_tokens=False)
        assert len(ids) == 1
        bias[str(ids[0])] = 8
    response = _chat(client, n=3, temperature=1.0, seed=4, response_format={"type": "json_object"}, logit_bias=bias)
    for choice in response.choices:
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(json.loads(choice.message.content), dict)


def test_constrained_and_unconstrained_share_batches(server):
    async def run():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        schema = SCHEMAS["flat"]
        constrained = [
            client.completions.create(
                model=MODEL_NAME,
                prompt=f"p{i}",
                max_tokens=MAX_TOKENS,
                temperature=1.0,
                seed=i,
                extra_body={"guided_json": schema},
            )
            for i in range(4)
        ]
        free = [
            client.completions.create(
                model=MODEL_NAME,
                prompt=f"p{i}",
                max_tokens=24,
                temperature=1.0,
                seed=i,
                extra_body={"ignore_eos": True},
            )
            for i in range(4)
        ]
        results = await asyncio.gather(*constrained, *free)
        await client.close()
        return results[:4], results[4:]

    constrained, free = asyncio.run(run())
    for r in constrained:
        jsonschema.validate(json.loads(r.choices[0].text), SCHEMAS["flat"])
    for r in free:
        assert r.usage.completion_tokens == 24 and r.choices[0].finish_reason == "length"


def test_logit_bias_through_the_api(client, model_dir):
    tok = Tokenizer(model_dir)
    forced = client.completions.create(
        model=MODEL_NAME, prompt="The", max_tokens=4, temperature=1.0, seed=1, logit_bias={"300": 100}
    )
    assert forced.choices[0].text == tok.decode([300] * 4)
    greedy = LLM(model_dir, device="cpu").generate(["The"], SamplingParams(max_tokens=1, temperature=0.0))
    top = greedy[0].outputs[0].token_ids[0]
    base = client.completions.create(model=MODEL_NAME, prompt="The", max_tokens=1, temperature=0.0)
    assert base.choices[0].text == tok.decode([top])  # the server's greedy token is the engine's
    banned = client.completions.create(
        model=MODEL_NAME, prompt="The", max_tokens=1, temperature=0.0, logit_bias={str(top): -100}
    )
    assert banned.choices[0].text != base.choices[0].text


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"guided_regex": "a("}, "guided_regex"),
        ({"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"bogus": 1}}, "structured_outputs.bogus"),
        ({"guided_json": {"type": "nope"}}, "guided_json"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"99999": 1}}, "logit_bias"),
    ],
)
def test_bad_constraints_are_400_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=3, extra_body=extra)
    assert info.value.status_code == 400
    assert info.value.body["param"] == param, info.value.body


def test_bad_json_schema_in_response_format(client):
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}})
    assert info.value.body["param"] == "response_format.json_schema.schema"
    assert "nope" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, response_format={"type": "xml"})
    assert info.value.body["param"] == "response_format.type"


# --- bounds on compiling: time, queue, abandoned requests, cache bytes, sizes at the API ---------


class _BusyWorker:
    """Unpickles, in the worker process, into a 60 s sleep: a compile that does not end."""

    def __reduce__(self):
        import time

        return (time.sleep, (60,))


def _compiler(model_dir, **options) -> GrammarCompiler:
    from inferd.engine.structured_outputs.grammar import tokenizer_info

    return GrammarCompiler(build_grammar, lambda: tokenizer_info(Tokenizer(model_dir), 512), **options)


def _worker_pids(compiler: GrammarCompiler) -> set[int]:
    return {w.process.pid for w in compiler._workers}


def test_compile_past_its_timeout_kills_its_worker(model_dir):
    from inferd.engine.structured_outputs.compiler import GrammarCompileFailed

    compiler = _compiler(model_dir, num_workers=1, timeout_s=0.2)
    try:
        stuck = compiler.submit(_BusyWorker())  # type: ignore[arg-type]
        with pytest.raises(GrammarCompileFailed, match="did not compile within 0.2 s"):
            stuck.result(timeout=120)
        assert compiler.num_killed == 1 and not compiler._workers  # the process is gone, not left computing
        assert compiler.submit(StructuredOutputsParams(regex="[ab]+")).result(timeout=120) is not None  # a fresh one
    finally:
        compiler.close()


def test_a_dropped_engine_leaves_no_compile_worker_behind(model_dir):
    import gc

    so = StructuredOutputs(Tokenizer(model_dir), 512, torch.device("cpu"), num_workers=1)
    assert so.compiler.submit(StructuredOutputsParams(regex="[ab]+")).result(timeout=120) is not None
    processes = [w.process for w in so.compiler._workers]
    assert processes and all(p.is_alive() for p in processes)
    del so
    gc.collect()
    for process in processes:
        process.join(timeout=30)
    assert not any(p.is_alive() for p in processes)


def test_a_worker_is_killed_once_when_close_and_its_slot_both_stop_it(model_dir):
    compiler = _compiler(model_dir, num_workers=1)
    assert compiler.submit(StructuredOutputsParams(regex="[ab]+")).result(timeout=120) is not None
    (worker,) = compiler._workers
    worker.kill()  # as a timed-out compile does
    compiler.close()  # then close() and the slot's exit stop it again: no second close of its pipe
    worker.kill()
    assert worker.is_killed and not worker.process.is_alive()


def test_abandoned_compile_stops_its_worker(model_dir):
    from inferd.engine.structured_outputs.grammar import _Held

    so = StructuredOutputs(Tokenizer(model_dir), 512, torch.device("cpu"), num_workers=1, compile_timeout_s=600)
    try:
        stuck = so.compiler.submit(_BusyWorker())  # type: ignore[arg-type]
        so._held["gone"] = _Held([], stuck)
        for _ in range(1200):  # the worker has the job
            if so.compiler._workers:
                break
            threading.Event().wait(0.1)
        pids = _worker_pids(so.compiler)
        so.drop("gone")  # the client disconnected
        with pytest.raises(Exception, match="requests have all gone"):
            stuck.result(timeout=120)
        assert pids and so.compiler.num_killed == 1 and not _worker_pids(so.compiler) & pids
    finally:
        so.close()


def test_a_full_compile_queue_refuses_with_busy(model_dir):
    from inferd.engine.structured_outputs.compiler import GrammarCompilerBusy

    compiler = _compiler(model_dir, num_workers=1, timeout_s=600, max_queued=1)
    try:
        compiler.submit(_BusyWorker())  # type: ignore[arg-type]
        compiler.submit(StructuredOutputsParams(regex="a"))
        with pytest.raises(GrammarCompilerBusy):
            for regex in ("b", "c"):
                compiler.submit(StructuredOutputsParams(regex=regex))
    finally:
        compiler.close()


def test_busy_compiler_leaves_no_request_behind(model_dir):
    from inferd.engine.structured_outputs.compiler import GrammarCompilerBusy

    engine = LLM(model_dir, device="cpu", max_queued_grammars=0, grammar_compile_workers=1).engine
    try:
        engine.structured.compiler.submit(_BusyWorker())  # type: ignore[arg-type]
        with pytest.raises(GrammarCompilerBusy):
            for i in range(2):
                params = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(regex=f"x{i}"))
                engine.add_request(f"r{i}", "hello", params)
        assert len(engine.requests) < 2 and engine.structured.num_held == len(engine.requests)
    finally:
        engine.structured.close()


def test_grammar_cache_is_bounded_in_bytes(model_dir):
    so = StructuredOutputs(Tokenizer(model_dir), 512, torch.device("cpu"))
    try:
        first = so.compile(StructuredOutputsParams(regex="[a-z]+"))
        size = first.result(timeout=120).memory_size_bytes
        so.cache_bytes = size + size // 2  # room for one such grammar, not two
        so.compile(StructuredOutputsParams(regex="[0-9]+")).result(timeout=120)
        so.compile(StructuredOutputsParams(regex="[0-9]+"))  # evicts by bytes now that its size is known
        assert 0 < so.num_cached_bytes <= so.cache_bytes
        assert so.compile(StructuredOutputsParams(regex="[a-z]+")) is not first
    finally:
        so.close()


def test_limits_refuse_oversized_constraints():
    from inferd.engine.structured_outputs.limits import StructuredOutputsLimits

    limits = StructuredOutputsLimits(max_values=3, max_bytes=128)
    limits.check(StructuredOutputsParams(choice=["a", "b", "c"]))
    with pytest.raises(ValueError, match="structured_outputs.choice has too many choices: 4"):
        limits.check(StructuredOutputsParams(choice=["a", "b", "c", "d"]))
    nested = {"type": "object", "properties": {"a": {"enum": [1, 2]}, "b": {"items": {"enum": [3], "const": 3}}}}
    with pytest.raises(ValueError, match="too many enum and const values: 4"):
        limits.check(StructuredOutputsParams(json=nested))
    with pytest.raises(ValueError, match="structured_outputs.regex is too large"):
        limits.check(StructuredOutputsParams(regex="a" * 129))


OVER_LIMIT = 1025  # the default max_grammar_values is 1024


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"guided_choice": [f"c{i}" for i in range(OVER_LIMIT)]}, "guided_choice"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "big", "schema": {"enum": list(range(OVER_LIMIT))}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"guided_regex": "a" * (129 << 10)}, "guided_regex"),
        ({"response_format": {"json_schema": {"name": "x", "schema": {"type": "object"}}}}, "response_format.type"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"$ref": "https://example.com/schema.json"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"guided_json": {"properties": {"a": {"$ref": "file:///etc/passwd"}}}}, "guided_json"),
    ],
)
def test_oversized_or_remote_constraints_are_400_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=3, extra_body=extra)
    assert info.value.status_code == 400
    assert info.value.body["param"] == param, info.value.body


def test_local_refs_still_compile(client):
    schema = {"$defs": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "$ref": "#/$defs/n"}
    out = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=8, extra_body={"guided_json": schema})
    assert 0 <= int(out.choices[0].text) <= 9


def test_a_grammar_that_does_not_compile_is_rejected_with_its_reason(model_dir):
    """The engine core turns `rejected` into a client error (400), not an empty 200 ending in abort."""
    engine = LLM(model_dir, device="cpu").engine
    try:
        bad = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(regex="a("))  # past the API
        engine.add_request("bad", "hello", bad)
        rejected: dict[str, str] = {}
        # the first compile starts a worker process (seconds, more on a loaded machine)
        deadline = time.monotonic() + 120
        while engine.has_unfinished() and time.monotonic() < deadline:
            engine.step()
            rejected |= engine.rejected
        assert "regex" in rejected.get("bad", ""), rejected
    finally:
        engine.structured.close()
