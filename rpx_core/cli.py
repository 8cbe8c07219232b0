"""The ``rpx`` command. Thin: parse arguments, call the API, print. User errors are one line and exit code 2.

Importing this module must not import torch: ``rpx --help``, ``rpx plugins`` and ``rpx gpus`` stay fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from rpx_core.commands import compare as compare_command
from rpx_core.commands import gpus as gpus_command
from rpx_core.commands import init as init_command
from rpx_core.commands import plot as plot_command
from rpx_core.commands import profile as profile_command
from rpx_core.commands import report as report_command
from rpx_core.commands import show as show_command
from rpx_core.commands.common import load_plugins
from rpx_core.exit_codes import ExitCode, for_signal
from rpx_core.show.text import echo
from rpx_core.version import __version__

EXIT_OK, EXIT_STAGE_FAILED, EXIT_INTERNAL = ExitCode.OK, ExitCode.FAILED, ExitCode.INTERNAL  # see rpx_core.exit_codes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rpx", description="Declarative, plugin-based model-efficiency profiler.")
    parser.add_argument("--version", action="version", version=f"rpx {__version__}")
    add_common_options(parser, defaults=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    add_common_options(common, defaults=False)  # also accepted after the command: `rpx run spec.toml --debug`

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, parents=[common])

    run = command("run", "run a spec and write its results")
    run.add_argument("spec", help="path to spec.toml")
    run.add_argument("-o", "--output", help="results file (default: the spec's `output`)")
    run.add_argument("--format", choices=("toml", "json"), help="results format (default: from the file suffix)")
    run.add_argument("--stages", help="comma-separated stages to run instead of the spec's (dependencies are added)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in the output file: keep every finished job, run the rest")
    run.add_argument("--isolation", choices=("auto", "worker", "in-process"),
                     help="run each model job in a worker process (auto, worker) or in rpx's own process (in-process, "
                          "for debugging); default: the spec's [execution] isolation")
    run.add_argument("--executor", metavar="NAME",
                     help="where the jobs run: local (default) or one a plugin adds, e.g. ray; default: the spec's "
                          "[execution] executor")
    run.add_argument("--dry-run", action="store_true", help="list the jobs (a sweep's points) and exit; run nothing")
    run.add_argument("--stage-timeout", type=float, metavar="SECONDS", help="kill and record a stage past this")
    run.add_argument("--job-timeout", type=float, metavar="SECONDS", help="kill and record a model job past this")
    run.add_argument("-q", "--quiet", action="store_true", help="print nothing but failed stages and the results path")
    run.add_argument("--events", choices=("jsonl",),
                     help="jsonl: one JSON object per event (stage started, progress, stage finished, run finished) "
                          "on stdout, instead of the tables")
    run.set_defaults(handler=cmd_run)

    validate = command("validate", "check a spec without running it")
    validate.add_argument("spec")
    validate.set_defaults(handler=cmd_validate)

    plugins = command("plugins", "list plugins with their distribution, version and hooks")
    plugins.add_argument("--json", action="store_true")
    plugins.set_defaults(handler=cmd_plugins)

    backends = command("backends", "list backends and whether they are available here")
    backends.add_argument("--json", action="store_true")
    backends.add_argument("--refresh", action="store_true",
                          help="probe every backend now (default: reuse answers up to 10 minutes old while the "
                               "installed packages, plugins, drivers and device variables are unchanged)")
    backends.set_defaults(handler=cmd_backends)

    for module in (gpus_command, init_command, profile_command, show_command, compare_command, plot_command,
                   report_command):
        module.register(command)
    return parser


def add_common_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """Options valid before or after the command; only the top-level parser sets defaults, so a value given after
    the command is not overwritten by the subparser's default."""
    keep = {} if defaults else {"default": argparse.SUPPRESS}
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors", **keep)
    parser.add_argument("--disable", action="append", metavar="PLUGIN", dest="disable" if defaults else "disable_after",
                        help="disable a plugin by name (repeatable; also RPX_DISABLE_PLUGINS=a,b)",
                        **(keep or {"default": []}))
    parser.add_argument("--strict-plugins", action="store_true", help="a plugin that fails to import is an error",
                        **(keep or {"default": None}))


def cmd_run(args: argparse.Namespace) -> int:
    """Plan once (every problem of the spec at once), then run the plan; SIGINT and SIGTERM stop it cleanly at any
    point, planning included."""
    from rpx_core.execution.interrupts import signals_raise

    with signals_raise():
        return run_planned(args)


def run_planned(args: argparse.Namespace) -> int:
    from rpx_core.api import with_inferred_backend
    from rpx_core.execution.pipeline import run_plan
    from rpx_core.show.console import RunConsole, choose_mode, print_tables
    from rpx_core.spec.checks import validate

    console = RunConsole(choose_mode(quiet=args.quiet, events=args.events))
    stages = tuple(s.strip() for s in args.stages.split(",") if s.strip()) if args.stages is not None else None
    overrides = {key: value for key, value in (("isolation", args.isolation), ("stage_timeout", args.stage_timeout),
                                               ("job_timeout", args.job_timeout), ("executor", args.executor))
                 if value is not None}
    with console:  # on a terminal, a line says what rpx is doing from its first moment
        console.note(f"checking {args.spec} and loading plugins")
        plugins = load_plugins(args)
        plan = validate(args.spec, plugins, stages=stages, output=Path(args.output) if args.output else None,
                        execution=overrides, prepare=lambda spec: with_inferred_backend(spec, plugins, {}))
        output = Path(args.output) if args.output else plan.spec.output_path()
        if not args.dry_run:
            console.note(f"{len(plan.jobs)} job(s), stages {', '.join(plan.stages)}: starting workers (each imports "
                         "the framework once)")
            result = run_plan(plan, plugins, output=output, fmt=args.format, spec_path=args.spec, observer=console,
                              resume=args.resume)
    if args.dry_run:
        from rpx_core.execution.executors import job_lines

        echo("\n".join(job_lines(plan, plugins)))
        return EXIT_STAGE_FAILED if plan.failed_models else EXIT_OK
    console.finished(output, result.ok)
    if console.mode in ("live", "plain"):
        print_tables(result, plugins.stages(plan.spec.choose).in_load_order())
    if console.mode != "jsonl":
        echo(f"results: {output}")
    return EXIT_OK if result.ok else EXIT_STAGE_FAILED


def cmd_validate(args: argparse.Namespace) -> int:
    from rpx_core.spec.checks import validate

    plugins = load_plugins(args)
    plan = validate(args.spec, plugins)
    spec = plan.spec
    echo(f"{args.spec}: ok — {len(plan.jobs)} model(s); stages: {', '.join(plan.stages)}")
    availability = plugins.backend(spec.backend, spec.choose, require_available=False).availability
    if not availability.available:
        echo(f"note: backend {spec.backend!r} is not available on this machine ({availability.reason}); "
              f"`rpx run` will {'skip its stages' if spec.on_unavailable == 'skip' else 'refuse it'} here")
    return EXIT_OK


def cmd_plugins(args: argparse.Namespace) -> int:
    """Always works: broken, invalid, clashing and disabled plugins are listed with the reason, not raised."""
    from rpx_core.convert import converter

    plugins = load_plugins(args, tolerant=True)
    infos, problems = plugins.infos(), plugins.problems()
    stages = plugins.stages().candidates
    order = {stage: plugins.hook_order(f"rpx_{stage}") for stage in sorted(stages)}
    sources = [{"scheme": scheme, "plugin": plugin, "description": source.description,
                "installed": not source.missing()}
               for scheme, options in sorted(plugins.model_sources().candidates.items()) for source, plugin in options]
    if args.json:
        print(json.dumps({"plugins": [converter.unstructure(info) for info in infos], "problems": problems,
                          "stage_hook_order": order, "model_sources": sources}, indent=2))
        return EXIT_OK
    for info in infos:
        origin = "built-in" if info.builtin else f"{info.distribution} {info.version}"
        hooks = ", ".join(h.removeprefix("rpx_") for h in info.hooks) or "-"
        status = "" if info.status == "loaded" else f"  [{info.status}{': ' + info.error if info.error else ''}]"
        echo(f"{info.name:<16} {origin:<28} {hooks}{status}")
    echo("\nstage hooks, plugins in the order they are asked (the first non-None answer wins):")
    for stage, plugin_names in order.items():
        echo(f"  {stage:<18} {' -> '.join(plugin_names) or '(no implementation)'}")
    echo("\nmodel sources (source = \"<scheme>:<name>\"):")
    for row in sources:
        missing = "" if row["installed"] else "  [library not installed]"
        echo(f"  {row['scheme'] + ':':<13} {row['plugin']:<16} {row['description']}{missing}")
    for problem in problems:
        echo(f"problem: {problem}")
    return EXIT_OK


def cmd_backends(args: argparse.Namespace) -> int:
    """Availability from a short-lived probing process, reused up to 10 minutes while nothing it depends on changed
    (rpx_core.registry.availability): listing backends imports no framework into this process."""
    from rpx_core.registry.availability import listed_availability

    plugins = load_plugins(args)
    registry = plugins.backends()
    found, age = listed_availability(plugins, registry, refresh=args.refresh)
    rows = []
    for name, backend in sorted(registry.unambiguous().items()):
        availability = found[name]
        rows.append({"name": name, "available": availability.available, "reason": availability.reason,
                     "framework": backend.framework, "precisions": list(backend.precisions),
                     "plugin": registry.provider(name), "probed_seconds_ago": round(age, 1)})
    for name, providers in registry.clashes().items():
        rows.append({"name": name, "available": False, "reason": f"registered by {', '.join(providers)}: choose one "
                     "with [choose.backends]", "framework": None, "precisions": [], "plugin": None})
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    cells = [(row["name"], "available" if row["available"] else "unavailable", ",".join(row["precisions"]),
              row["reason"]) for row in rows]
    widths = [max((len(cell[index]) for cell in cells), default=0) for index in range(3)]
    for cell in cells:
        echo("  ".join(text.ljust(width) for text, width in zip(cell, widths)) + "  " + cell[3])
    if age:
        print(f"\n(probed {age:.0f} s ago; `rpx backends --refresh` probes now)")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_command(args.handler, args)


def run_command(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a command; every outcome is one line and a documented exit code (``--debug`` adds the traceback only)."""
    from rpx_core.errors import RpxError
    from rpx_core.execution.interrupts import signal_of

    warnings.showwarning = _one_line_warning
    try:
        return handler(args)
    except RpxError as exc:
        _traceback_if(args.debug)
        echo("\n".join(f"rpx: error: {line}" for line in str(exc).splitlines() or [""]), file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError as exc:
        if not _stdout_closed():  # a pipe of rpx's own (to a worker) broke: a bug, not a reader gone
            return _internal_error(exc, args.debug)
        sys.stderr.close()  # output piped into `head` and closed early: not an error
        return EXIT_OK
    except KeyboardInterrupt as interrupt:  # SIGINT, or SIGTERM (rpx_core.execution.interrupts.Interrupted)
        _traceback_if(args.debug)
        code = for_signal(signal_of(interrupt))
        echo(f"rpx: interrupted ({code.name}){_unfinished(interrupt)}; what finished is in the results file, if one "
             "was started; `rpx run --resume` continues", file=sys.stderr)
        return code
    except Exception as exc:
        return _internal_error(exc, args.debug)


def _internal_error(exc: Exception, debug: bool) -> int:
    _traceback_if(debug)
    hint = "" if debug else " (rerun with --debug for the traceback)"
    echo(f"rpx: internal error: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
    return EXIT_INTERNAL


def _unfinished(interrupt: BaseException, shown: int = 5) -> str:
    """The jobs an interruption left unfinished, for its message (the results file lists them all)."""
    names = getattr(interrupt, "unfinished", ())
    if not names:
        return ""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"; {len(names)} job(s) did not finish: {', '.join(names[:shown])}{more}"


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (what a BrokenPipeError means when rpx's output is piped)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll() on this platform, or no stdout to ask
        return True


def _traceback_if(debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc()


def _one_line_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    echo(f"rpx: warning: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
