"""The options of `inferd bench serve`, and their checks: a bad value is an argparse
error naming its flag (exit status 2), before any server starts."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from .arrivals import ARRIVALS
from .burst_sampling import SamplingMix
from .datasets import DATASETS
from .serve_config import DEFAULT_RATES, BenchConfig
from .slo_classes import SloClass, check_classes, parse_goodput, parse_slo_class

PARSER = "_bench_serve_parser"  # the subcommand's parser, kept on the namespace for errors found after parsing


class OptionError(ValueError):
    def __init__(self, flag: str, message: str):
        super().__init__(f"argument {flag}: {message}")
        self.flag = flag


def fail(args: argparse.Namespace, error: OptionError | ValueError) -> NoReturn:
    parser = getattr(args, PARSER, None)
    if parser is None:  # a namespace built by hand
        print(f"inferd bench serve: error: {error}", file=sys.stderr)
        raise SystemExit(2)
    parser.error(str(error))  # exits with status 2
    raise AssertionError("unreachable")


def _type(parse):
    """An argparse type from a parser that raises ValueError with a readable message."""

    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"expected R1,R2,... (requests/s), got {text!r}") from None
    if any(not r > 0 for r in rates):
        raise ValueError(f"rates must be positive, got {text!r}")
    if sorted(rates) != rates:
        raise ValueError(f"rates must rise, got {text!r}")
    return rates


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be > 0, got {text!r}")
    return value


def _words_range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"expected MIN,MAX (words), got {text!r}") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"need 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


def _readable_file(text: str) -> str:
    if not os.path.isfile(text) or not os.access(text, os.R_OK):
        raise ValueError(f"cannot read {text!r}")
    return text


def _dataset(text: str) -> str:
    if text in DATASETS:
        return text
    if not os.path.isfile(text) or not os.access(text, os.R_OK):
        raise ValueError(f"cannot read {text!r} (a ShareGPT JSON or JSONL file, or one of {', '.join(DATASETS)})")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(**{PARSER: parser})
    parser.add_argument("--url", help="benchmark a running OpenAI-compatible server (default: start inferd serve)")
    parser.add_argument("--model", help="checkpoint directory for the started server")
    parser.add_argument(
        "--preset",
        choices=["tiny", "small"],
        help="make-model preset for the started server "
        "(written under a temporary folder); default: the embedded tiny model",
    )
    parser.add_argument("--served-model-name", default=None, help="model name to request (default: the server's)")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra option for the started server, e.g. --server-arg=--max-num-seqs=32 (repeatable)",
    )
    parser.add_argument("--out", default="bench-serve", help="output prefix: PREFIX.json and PREFIX.png")

    load = parser.add_argument_group("offered load")
    load.add_argument(
        "--rates",
        type=_type(_rates),
        help="offered loads, requests/s, rising; one level each (default 1,2,4,8,16,32; "
        "with --arrival trace: time-scale the trace to each rate instead of replaying it as recorded)",
    )
    load.add_argument("--duration", type=_type(_positive), help="seconds of arrivals per level (default 20)")
    load.add_argument("--arrival", choices=ARRIVALS, default="poisson", help="arrival process (default poisson)")
    load.add_argument(
        "--burstiness",
        type=_type(_positive),
        help="--arrival gamma: shape of the gamma inter-arrival gaps (1: Poisson, < 1 burstier; default 1)",
    )
    load.add_argument(
        "--trace",
        type=_type(_readable_file),
        help="--arrival trace: JSONL, a line {timestamp: s, prompt_len?, output_len?, class?} per request",
    )
    load.add_argument("--seed", type=int, default=0, help="seed of arrivals, dataset order and class order")

    data = parser.add_argument_group("requests")
    data.add_argument(
        "--dataset",
        type=_type(_dataset),
        default="synthetic",
        help="synthetic (ShareGPT-like lognormal lengths; default), uniform (--prompt-len words, --max-tokens "
        "output), or a ShareGPT JSON/JSONL file (first human turn; output length of the first gpt reply)",
    )
    data.add_argument(
        "--prompt-len", type=_type(_words_range), help="--dataset uniform: prompt words MIN,MAX (default 16,256)"
    )
    data.add_argument(
        "--max-tokens",
        type=int,
        help="--dataset uniform: output tokens of every request (default 64); other datasets: a cap (default none)",
    )
    data.add_argument(
        "--max-model-len", type=int, help="context for the length filter (default: the server's, else 2048)"
    )
    data.add_argument("--temperature", type=float, help="of the sampled requests (default 1.0)")
    data.add_argument("--top-p", type=float, default=1.0, help="of the sampled requests (default 1.0: off)")
    data.add_argument("--top-k", type=int, default=0, help="of the sampled requests (default 0: off)")
    data.add_argument(
        "--sampled-share",
        type=float,
        help="share of requests that sample, spread evenly; the rest are greedy "
        "(default 1 when a sampling option is given, else 0)",
    )

    slo = parser.add_argument_group("SLO classes and goodput")
    slo.add_argument(
        "--slo-class",
        action="append",
        type=_type(parse_slo_class),
        metavar="NAME:share=S[,ttft=S][,tpot=S][,e2e=S]",
        help="a class of requests and its targets in seconds (repeatable; shares sum to 1; "
        "no target: best effort; default: one class 'default', best effort unless --goodput)",
    )
    slo.add_argument(
        "--goodput",
        nargs="+",
        metavar="KEY:MS",
        help="vllm bench serve's form: targets of the one class 'default', KEY ttft, tpot or e2el, in ms",
    )
    slo.add_argument(
        "--send-slo-class",
        action="store_true",
        help='send each request\'s class as the body field "slo_class" (off: servers that do not know it never see it)',
    )


def _classes(args: argparse.Namespace) -> list[SloClass]:
    if args.slo_class and args.goodput:
        raise OptionError("--goodput", "sets the targets of the class 'default'; with --slo-class give them per class")
    if args.goodput:
        try:
            return [parse_goodput(args.goodput)]
        except ValueError as exc:
            raise OptionError("--goodput", str(exc)) from None
    classes = args.slo_class or [SloClass("default", 1.0)]
    try:
        check_classes(classes)
    except ValueError as exc:
        raise OptionError("--slo-class", str(exc)) from None
    return classes


def _sampling(args: argparse.Namespace) -> SamplingMix:
    asked = args.temperature is not None or args.top_p != 1.0 or args.top_k != 0
    share = args.sampled_share if args.sampled_share is not None else (1.0 if asked else 0.0)
    if not 0.0 <= share <= 1.0:
        raise OptionError("--sampled-share", f"must be in [0, 1], got {share!r}")
    try:
        return SamplingMix(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, mix=share)
    except ValueError as exc:
        field = str(exc).split()[0]  # SamplingMix's messages start with the field's name
        raise OptionError("--" + field.replace("_", "-"), str(exc)) from None


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The run's BenchConfig; an OptionError names the flag at fault."""
    is_trace = args.arrival == "trace"
    if is_trace and args.trace is None:
        raise OptionError("--arrival", "trace needs --trace PATH")
    if args.trace is not None and not is_trace:
        raise OptionError("--trace", "goes with --arrival trace")
    if args.burstiness is not None and args.arrival != "gamma":
        raise OptionError("--burstiness", "goes with --arrival gamma")
    if is_trace and args.duration is not None:
        raise OptionError("--duration", "does not apply to --arrival trace (the trace sets the arrivals)")
    if args.prompt_len is not None and args.dataset != "uniform":
        raise OptionError("--prompt-len", "goes with --dataset uniform (other datasets set their own lengths)")
    if args.max_tokens is not None and args.max_tokens < 2:
        raise OptionError("--max-tokens", f"must be >= 2 (inter-token latency needs two tokens), got {args.max_tokens}")
    if args.max_model_len is not None and args.max_model_len < 8:
        raise OptionError("--max-model-len", f"must be >= 8, got {args.max_model_len}")
    lo, hi = args.prompt_len or (16, 256)
    return BenchConfig(
        rates=args.rates if args.rates is not None or is_trace else list(DEFAULT_RATES),
        duration_s=args.duration if args.duration is not None else 20.0,
        dataset=args.dataset,
        prompt_len_min=lo,
        prompt_len_max=hi,
        max_tokens=args.max_tokens,
        max_model_len=args.max_model_len,
        seed=args.seed,
        arrival=args.arrival,
        burstiness=args.burstiness if args.burstiness is not None else 1.0,
        trace=args.trace,
        classes=_classes(args),
        send_slo_class=args.send_slo_class,
        sampling=_sampling(args),
    )
