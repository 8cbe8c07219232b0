"""``rpx profile MODEL --input 1x128``: a quick look without a spec. The spec is built in memory (as ``rpx init``
would write it), checked and run like ``rpx run``'s, and the summary printed; ``--save-spec`` writes the spec used."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable


def register(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    parser = command("profile", "profile one model without writing a spec")
    parser.add_argument("model", help="'pkg.module:callable', 'model.py[:callable]' or a named model such as "
                                      "'hf:gpt2', 'hf:./local-config-folder', 'torchvision:resnet50'")
    parser.add_argument("--input", metavar="SHAPE", help="input shape, e.g. 1x128 (hf: batch x sequence; "
                                                         "images: batch x channels x height x width)")
    parser.add_argument("--gpus", help="comma-separated GPU names for rooflines (`rpx gpus`), or 'all'")
    parser.add_argument("--precision", help="fp32 (default), tf32, fp16, bf16, fp8, int8")
    parser.add_argument("--stages", help="comma-separated stages (default: Tier 1 and the system card, plus the "
                                         "roofline with --gpus)")
    parser.add_argument("--backend", help="backend (default: cpu)")
    parser.add_argument("--option", action="append", default=[], metavar="STAGE.KEY=VALUE",
                        help="a stage option, e.g. serve.contexts=[8192] (the value is TOML; a bare word is a "
                             "string); repeatable")
    parser.add_argument("--kwarg", action="append", default=[], metavar="KEY=VALUE",
                        help="a keyword argument of the model's builder, e.g. auto_class=AutoModelForCausalLM "
                             "(an hf: model's task head); repeatable")
    parser.add_argument("-o", "--output", help="results file (default: rpx-results/<model>.toml)")
    parser.add_argument("--save-spec", metavar="FILE", help="also write the spec this run used")
    parser.set_defaults(handler=cmd_profile)


def comma_list(text: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def assignment(text: str, flag: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (KEY, VALUE read as TOML, or as a string when it is not a TOML value)."""
    import tomllib

    from rpx_core.errors import RpxError

    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise RpxError(f"{flag} {text!r}: write KEY=VALUE, e.g. {flag} serve.contexts=[8192]")
    try:
        return key.strip(), tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return key.strip(), value


def stage_options(texts: list[str]) -> dict[str, dict[str, Any]]:
    """``--option STAGE.KEY=VALUE`` flags as stage name -> options table."""
    from rpx_core.errors import RpxError

    options: dict[str, dict[str, Any]] = {}
    for text in texts:
        path, value = assignment(text, "--option")
        stage, dot, key = path.partition(".")
        if not dot or not stage or not key:
            raise RpxError(f"--option {text!r}: name the stage and its option, e.g. --option serve.contexts=[8192]")
        options.setdefault(stage, {})[key] = value
    return options


#: Spec key paths of the spec ``rpx profile`` builds, and the argument each came from (errors name the argument).
ARGUMENTS = (("models[0].source", "MODEL"), ("models[0].input_shape", "--input"), ("models[0].inputs", "--input"),
             ("gpus", "--gpus"), ("precision", "--precision"), ("stages", "--stages"), ("backend", "--backend"),
             ("output", "-o"), ("options", "--option"), ("models[0].kwargs", "--kwarg"), ("models[0]", "MODEL"))


def in_own_terms(message: str) -> str:
    """``message`` with the key paths of the built spec replaced by the ``rpx profile`` arguments they came from
    (``rpx profile: models[0].source: ...``, and an input named in parentheses: ``x.py (models[0].source)``)."""
    import re

    def argument_of(path: str) -> str | None:
        for key, argument in ARGUMENTS:
            if path == key or path.startswith((f"{key}.", f"{key}[")):
                return argument
        return None

    def rename(match: re.Match[str]) -> str:
        argument = argument_of(match.group(1))
        return f"rpx profile: {argument}: " if argument else match.group(0)

    def rename_role(match: re.Match[str]) -> str:
        argument = argument_of(match.group(1))
        return f"({argument})" if argument else match.group(0)

    message = re.sub(r"rpx profile: ([A-Za-z_][\w.\[\]]*): ", rename, message)
    return re.sub(r"\((models\[0\][\w.\[\]]*)\)", rename_role, message)


def _identity(source: str) -> str:
    """A model source with its file resolved, so a relative and an absolute path to one file are one model."""
    module, colon, attr = source.rpartition(":")
    return f"{Path(module).resolve()}:{attr}" if colon and module.endswith(".py") else source


def refuse_other_models_results(output: Path, source: str) -> None:
    """The default results file is named for the model; if it already holds another model's results (another file's
    ``:build``, say), say so instead of replacing them."""
    from rpx_core.errors import RpxError
    from rpx_core.results.serialise import load

    if not output.exists():
        return
    try:
        sources = {model.source for model in load(output).models}
    except RpxError:
        sources = {"?"}
    if sources and {_identity(held) for held in sources} != {_identity(source)}:
        held = ", ".join(sorted(sources)) if sources != {"?"} else "something that is not rpx results"
        raise RpxError(f"{output} holds the results of another model ({held}); give -o FILE to write this "
                       "profile elsewhere, or remove that file")


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile one model; errors speak of the command's own arguments, not of the spec it builds."""
    from rpx_core.errors import RpxError

    try:
        return profile(args)
    except RpxError as error:
        error.args = (in_own_terms(str(error)),)
        raise


def profile(args: argparse.Namespace) -> int:
    from rpx_core.api import run_spec
    from rpx_core.commands.common import load_plugins
    from rpx_core.exit_codes import ExitCode
    from rpx_core.registry.sources import parse_shape
    from rpx_core.results.safe_write import Input, atomic_write, check_output
    from rpx_core.show.console import RunConsole, choose_mode, print_tables
    from rpx_core.show.text import echo
    from rpx_core.spec.inputs import spec_inputs
    from rpx_core.spec.schema import spec_from_dict
    from rpx_core.spec.starter import relocate, render, spec_data

    stages = comma_list(args.stages) if args.stages is not None else None
    data = spec_data(args.model, parse_shape(args.input) if args.input else None, gpus=comma_list(args.gpus),
                     precision=args.precision, stages=stages, backend=args.backend,
                     kwargs=dict(assignment(text, "--kwarg") for text in args.kwarg),
                     options=stage_options(args.option))
    if args.output:
        data["output"] = args.output
    plugins = load_plugins(args)
    spec = spec_from_dict(data, where="rpx profile", base_dir=".")
    output = spec.output_path()
    if not args.output:
        refuse_other_models_results(output, spec.models[0].source)
    if args.save_spec:  # both files checked before either is written; the run checks its output again
        saved = Path(args.save_spec)
        inputs = spec_inputs(spec, plugins)
        check_output(output, [*inputs, Input(saved, "the spec --save-spec writes")])
        check_output(saved, [*inputs, Input(output, "the results file of this run")])
        atomic_write(saved, render(relocate(data, saved.parent)), inputs)
        echo(f"spec: {saved}")
    with RunConsole(choose_mode(quiet=False, events=None)) as console:
        result = run_spec(spec, output=output, plugins=plugins, stages=stages, observer=console, where="rpx profile")
    print_tables(result, plugins.stages(spec.choose).in_load_order())
    echo(f"results: {output}")
    return ExitCode.OK if result.ok else ExitCode.FAILED

