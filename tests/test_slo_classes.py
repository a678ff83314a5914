"""SLO classes: parsing the --slo-class specs and the classes file, every bad value a
startup error naming its flag; a request's class from the body field or the X-SLO-Class
header (the field wins), a 400 naming either for an unknown or malformed one; a class's
priority stands in for a request that sends none."""

from __future__ import annotations

import argparse

import pytest
from starlette.requests import Request

from inferd.engine.request.slo import RequestSlo, SloClass, SloClasses, load_slo_classes_file
from inferd.engine.server.api_models import CompletionRequest
from inferd.engine.server.cli import add_arguments, slo_classes_from_args
from inferd.engine.server.errors import ApiError
from inferd.engine.server.job import Prompt
from inferd.engine.server.serving import OpenAIServing


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_spec_parsing():
    c = SloClass.parse("interactive:ttft=0.2,tpot=0.05,priority=-1,on_miss=demote")
    assert c == SloClass("interactive", 0.2, 0.05, -1, "demote")
    assert not c.is_best_effort
    batch = SloClass.parse("batch")
    assert batch == SloClass("batch") and batch.is_best_effort
    assert SloClass.parse("bulk:priority=3").priority == 3


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("i:ttft=-1", "ttft must be in"),
        ("i:ttft=0", "ttft must be in"),
        ("i:ttft=1e9", "ttft must be in"),
        ("i:ttft=nan", "ttft must be a number"),
        ("i:ttft=fast", "ttft must be a number"),
        ("i:tpot=-0.1", "tpot must be in"),
        ("i:priority=1.5", "priority must be an integer"),
        ("i:on_miss=drop", "on_miss must be one of"),
        ("i:deadline=3", "unknown key(s) deadline"),
        ("i:ttft", "is not KEY=VALUE"),
        ("i:ttft=1,ttft=2", "ttft given twice"),
        ("bad name:ttft=1", "SLO class name"),
        (":ttft=1", "SLO class name"),
    ],
)
def test_bad_specs_are_startup_errors_naming_the_flag(spec, fragment):
    with pytest.raises(ValueError) as err:
        slo_classes_from_args(parse("--slo-class", spec))
    assert str(err.value).startswith("--slo-class") and fragment in str(err.value)


def test_duplicate_and_unknown_default_name_their_flags():
    with pytest.raises(ValueError, match="^--slo-class: .*configured twice"):
        slo_classes_from_args(parse("--slo-class", "a:ttft=1", "--slo-class", "a:ttft=2"))
    with pytest.raises(ValueError, match="^--default-slo-class: .*'b' is not a configured class"):
        slo_classes_from_args(parse("--slo-class", "a:ttft=1", "--default-slo-class", "b"))


def test_classes_file_yaml_and_json(tmp_path):
    yaml_file = tmp_path / "classes.yaml"
    yaml_file.write_text("- {name: interactive, ttft: 0.5, tpot: 0.1, priority: -1}\n- name: batch\n")
    json_file = tmp_path / "classes.json"
    json_file.write_text('[{"name": "bulk", "ttft": 60, "on_miss": "demote"}]')
    assert [c.name for c in load_slo_classes_file(yaml_file)] == ["interactive", "batch"]
    classes = slo_classes_from_args(
        parse("--slo-classes-file", str(yaml_file), "--slo-class", "x:ttft=1", "--default-slo-class", "batch")
    )
    assert sorted(classes.classes) == ["batch", "interactive", "x"] and classes.default.name == "batch"
    assert load_slo_classes_file(json_file) == [SloClass("bulk", 60.0, None, None, "demote")]
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {name: i, ttft: -2}\n")
    with pytest.raises(ValueError, match="^--slo-classes-file .*ttft must be in"):
        slo_classes_from_args(parse("--slo-classes-file", str(bad)))
    bad.write_text("name: i\n")
    with pytest.raises(ValueError, match="expected a list"):
        slo_classes_from_args(parse("--slo-classes-file", str(bad)))
    with pytest.raises(ValueError, match="^--slo-classes-file"):
        slo_classes_from_args(parse("--slo-classes-file", str(tmp_path / "missing.yaml")))


def test_without_classes_everything_is_the_implicit_best_effort_default():
    classes = slo_classes_from_args(parse())
    assert not classes.is_configured
    assert classes.get(None) == SloClass("default") and classes.names == ["default"]
    with pytest.raises(KeyError):
        classes.get("interactive")


def test_request_slo_deadline():
    classes = SloClasses.build([SloClass("i", 0.25), SloClass("b")])
    assert classes.request_slo(classes.get("i"), 100.0) == RequestSlo("i", 0.25, None, 100.25)
    assert classes.request_slo(classes.get("b"), 100.0).is_best_effort
    assert classes.get(None).name == "default"  # no --default-slo-class: best effort


# --- the API -------------------------------------------------------------------------------


class _Engine:
    tokenizer = None


def serving() -> OpenAIServing:
    classes = SloClasses.build(
        [SloClass("interactive", 0.5, 0.1, priority=-3), SloClass("batch", priority=4)], default_class="batch"
    )
    return OpenAIServing(_Engine(), "m", slo_classes=classes)  # type: ignore[arg-type]


def request(headers: dict[str, str] | None = None) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": raw})


def test_class_from_field_header_or_default():
    s = serving()
    body = CompletionRequest(prompt="x")
    assert s.slo_class(body, request()).name == "batch"
    assert s.slo_class(body, request({"X-SLO-Class": "interactive"})).name == "interactive"
    field = CompletionRequest(prompt="x", slo_class="batch")
    assert s.slo_class(field, request({"X-SLO-Class": "interactive"})).name == "batch"  # the field wins


@pytest.mark.parametrize(
    "body, headers, param, fragment",
    [
        ({"slo_class": "gold"}, {}, "slo_class", "unknown SLO class 'gold'"),
        ({}, {"X-SLO-Class": "gold"}, "X-SLO-Class", "unknown SLO class 'gold'"),
        ({}, {"X-SLO-Class": "a b"}, "X-SLO-Class", "must be a class name"),
        ({}, {"X-SLO-Class": ""}, "X-SLO-Class", "must be a class name"),
        ({}, {"X-SLO-Class": "x" * 65}, "X-SLO-Class", "must be a class name"),
    ],
)
def test_bad_class_is_a_400_naming_the_field(body, headers, param, fragment):
    with pytest.raises(ApiError) as err:
        serving().slo_class(CompletionRequest(prompt="x", **body), request(headers))
    assert err.value.status == 400 and err.value.param == param and fragment in err.value.message
    if fragment.startswith("unknown"):
        assert "batch, interactive" in err.value.message  # the classes there are


def test_priority_field_wins_over_the_class_priority():
    s = serving()
    interactive = s.slo_classes.get("interactive")
    params = CompletionRequest(prompt="x").sampling_params(4, None)
    job = s._job(CompletionRequest(prompt="x"), interactive, [Prompt("x", [1])], params, chat=False)
    assert job.priority == -3
    job = s._job(CompletionRequest(prompt="x", priority=0), interactive, [Prompt("x", [1])], params, chat=False)
    assert job.priority == 0  # sent explicitly, even the default value
    plain = OpenAIServing(_Engine(), "m")  # type: ignore[arg-type]
    job = plain._job(CompletionRequest(prompt="x"), plain.slo_classes.get(None), [Prompt("x", [1])], params, False)
    assert job.priority == 0
