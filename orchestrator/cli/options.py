"""What every command's parser shares, and how a command reports bad input; imports nothing heavy.

A command builds its parser from this module alone and imports torch, Ray and MLflow only after
its arguments parsed, so `--help` (and a refused option) answers at once.

Bad input (a job file, a plan, an option) exits 2 naming the field and what is allowed, on
stderr; with `--json` the same error is also one JSON object on stdout:
`{"error": ..., "field": ..., "exit_code": 2}` (plus `fields`/`problems` when a job file has
several). Options are checked by argparse (`type=` validators below) before anything starts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Protocol, Sequence

from orchestrator.progress import configure_output

EXIT_BAD_INPUT, EXIT_NO_MODEL, EXIT_FAILED = 2, 3, 1

# Upper bounds of time options: a calibration or nightly budget beyond a week, or a model age
# beyond ten years, is a typo (and would overflow the timeouts computed from it).
MAX_BUDGET_S = 7 * 24 * 3600.0
MAX_AGE_DAYS = 3650.0

EXIT_CODES = """exit codes:
  0  done
  1  the tracking server stayed unavailable, or another calibration held the lock too long
  2  bad input: the field is named with the values allowed (with --json, also as JSON on stdout)
  3  no model for this hardware, and none may be calibrated"""

ENVIRONMENT = """environment:
  AUTOTUNE_HOME        calibrations, plans, Ray results, the default MLflow store (default .autotune)
  MLFLOW_TRACKING_URI  the MLflow store when --tracking-uri is not given
  RAY_ADDRESS          the Ray cluster when --ray-address is not given (ray job submit sets it)
  AUTOTUNE_CORE_BINDING  exclusive (default: each rank and probe actor on its own share of its
                       host's cores) or off"""


class UsageError(SystemExit):
    """A bad command line: argparse's message (already on stderr) and the option it names;
    exits 2 like argparse's own error, so callers outside `run_main` see no difference."""

    def __init__(self, message: str, field: str):
        super().__init__(EXIT_BAD_INPUT)
        self.message, self.field = message, field


class NoModelError(SystemExit):
    """No champion model to plan with (exit 3); the hint is already on stderr."""

    def __init__(self, message: str):
        super().__init__(EXIT_NO_MODEL)
        self.message = message


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with its errors (exit 2) also reported as JSON by `run_main` under --json."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise UsageError(message, _option_named(message))


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's default after its help (unless unset or a plain flag); the description
    and epilog kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in text:
            return text
        return f"{text} (default: %(default)s)"


def program_name(module: str) -> str:
    """How the user started this command: the console script's name (`autotune-plan`), or
    `python -m <module>`; usage lines and errors say it back."""
    invoked = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if not invoked or invoked.endswith(".py") or invoked in ("-m", "-c", "python", "python3"):
        return f"python -m {module}"
    return invoked


def command_parser(module: str, doc: str, examples: Sequence[str] = ()) -> ArgumentParser:
    """The parser of a command: described by its module `doc` (first paragraph), with its
    examples, the environment it reads and the exit codes in the epilog."""
    description = doc.strip().split("\n\n", 1)[0]
    shown = "\n".join(f"  {e}" for e in examples)
    epilog = "\n\n".join(part for part in (f"examples:\n{shown}" if examples else "", ENVIRONMENT, EXIT_CODES) if part)
    return ArgumentParser(
        prog=program_name(module), description=description, epilog=epilog, formatter_class=_HelpFormatter
    )


def job_parser(module: str, doc: str, examples: Sequence[str] = ()) -> ArgumentParser:
    """`command_parser` with the required --job option and the common ones (`add_common`)."""
    parser = command_parser(module, doc, examples)
    parser.add_argument("--job", required=True, help="job YAML file (examples/dlrm_small.yaml shows every field)")
    add_common(parser)
    return parser


def _option_named(message: str) -> str:
    """The option an argparse message is about: `argument --budget-s: ...`, `... required: --job`,
    `unrecognized arguments: --x`, or the first --option it mentions."""
    if message.startswith("argument "):
        names = message[len("argument ") :].split(":", 1)[0].strip().split("/")
        return next((n for n in names if n.startswith("--")), names[0])
    for token in message.replace(",", " ").split():
        if token.startswith("-"):
            return token.split("=", 1)[0]
    return "arguments"


def number_in(
    minimum: float, maximum: float, *, minimum_allowed: bool = False, unit: str = ""
) -> Callable[[str], float]:
    """An argparse `type=`: a finite number in (minimum, maximum] ([minimum, maximum] when
    `minimum_allowed`); NaN, infinities and anything outside are refused naming the range."""
    low = "[" if minimum_allowed else "("
    shown = [str(int(v)) if float(v).is_integer() else f"{v:g}" for v in (minimum, maximum)]
    allowed = f"a finite number{' of ' + unit if unit else ''} in {low}{shown[0]}, {shown[1]}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None
        if not (
            math.isfinite(value) and (value >= minimum if minimum_allowed else value > minimum) and value <= maximum
        ):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}")
        return value

    parse.__name__ = "number"  # argparse names the type in some messages
    return parse


def int_in(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse `type=`: an integer in minimum..maximum, refused naming the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in {minimum}..{maximum}, got {text!r}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"expected an integer in {minimum}..{maximum}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


budget_s = number_in(0.0, MAX_BUDGET_S, unit="seconds")
age_days = number_in(0.0, MAX_AGE_DAYS, unit="days")
seed = int_in(0, 2**32 - 1)


def output_file(text: str) -> str:
    """An argparse `type=` for a file to write: refused now if it names a directory (not
    after the work that produces it)."""
    if not text or Path(text).is_dir():
        raise argparse.ArgumentTypeError(
            f"expected a file path to write, got {text!r}" + (" (a directory)" if text else "")
        )
    return text


def output_dir(text: str) -> str:
    """An argparse `type=` for a directory to write into: refused now if it names a file."""
    if not text or (Path(text).exists() and not Path(text).is_dir()):
        raise argparse.ArgumentTypeError(
            f"expected a directory to write into, got {text!r}" + (" (an existing file)" if text else "")
        )
    return text


def calibration_dir(text: str) -> str:
    """An argparse `type=` for a calibration directory to refit from."""
    path = Path(text)
    missing = [n for n in ("fingerprint.json", "measurements.jsonl") if not (path / n).is_file()]
    if not path.is_dir() or missing:
        raise argparse.ArgumentTypeError(
            f"expected a calibration directory ($AUTOTUNE_HOME/calibrations/<stamp>, holding fingerprint.json and "
            f"measurements.jsonl), got {text!r}" + (f" (no {', '.join(missing)} there)" if path.is_dir() else "")
        )
    return text


def trace_dir(text: str) -> str:
    """An argparse `type=` for a directory of per-rank profiler traces to read."""
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"expected a directory of per-rank Kineto traces, got {text!r}")
    return text


def add_lock_timeout(parser: argparse.ArgumentParser) -> None:
    """--lock-timeout-s of the commands that calibrate under the hardware's promotion lease."""
    parser.add_argument(
        "--lock-timeout-s",
        type=number_in(0.0, 4 * MAX_BUDGET_S, minimum_allowed=True, unit="seconds"),
        default=None,
        help="wait this long for another calibration of this hardware to finish (unset: 3 x the budget + 300 s)",
    )


def add_tracking_uri(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (unset: $MLFLOW_TRACKING_URI, else sqlite:///$AUTOTUNE_HOME/mlflow.db)",
    )


def add_output(parser: argparse.ArgumentParser) -> None:
    """--json, --quiet and --verbose: what goes to stdout and how much to stderr."""
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors on stderr")
    loudness.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also debug lines, and what Ray, its workers, MLflow, torch and FBGEMM print",
    )


def add_common(parser: argparse.ArgumentParser) -> None:
    add_tracking_uri(parser)
    parser.add_argument("--ray-address", help="Ray cluster address (unset: $RAY_ADDRESS, else a new local cluster)")
    add_output(parser)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line and set how much goes to stderr (`progress.configure_output`)."""
    args = parser.parse_args(argv)
    configure_output(quiet=getattr(args, "quiet", False), verbose=getattr(args, "verbose", False))
    return args


def emit(obj: dict[str, Any], as_json: bool, human: Callable[[dict[str, Any]], None]) -> None:
    """A command's result: `human(obj)` says it on stderr, and with --json `obj` is also the one
    JSON object on stdout."""
    human(obj)
    if as_json:
        print(json.dumps(obj))


def wants_json(argv: Sequence[str] | None) -> bool:
    """Whether the command line asks for --json (argparse also takes an unambiguous prefix)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" in args:
        args = args[: args.index("--")]
    return any(a.startswith("--js") and "--json".startswith(a) for a in args)


def bad_input(
    message: str, field: str, as_json: bool, code: int = EXIT_BAD_INPUT, echo: bool = True, **extra: Any
) -> int:
    """Report an input error: the message on stderr (unless already there), and with --json one
    JSON object on stdout naming the field; returns the exit code."""
    if echo:
        print(message, file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message, "field": field, "exit_code": code, **extra}))
    return code


def known_failure(exc: BaseException) -> tuple[str, str, int, dict[str, Any]] | None:
    """(message, field, exit code, extra JSON) of an error the user can act on, else None.

    The error types live in the heavy modules; by the time one is raised they are imported, so
    they are looked up here, not imported with the parser."""
    from orchestrator.core_binding import BINDING_ENV, BindingError
    from orchestrator.lease import LeaseTimeout
    from orchestrator.registry import RegistryUnavailable
    from policies.plan import PlanError
    from policies.sharders import NoFeasiblePlanError
    from predictors.collective_curves import UncalibratedGroupError
    from predictors.network import NetworkError
    from probes.vocabulary.chunks import ScheduleError
    from probes.vocabulary.jobspec import JobSpecError
    from probes.vocabulary.placement import PlacementError
    from probes.vocabulary.table_shards import ShardingPlanError

    if isinstance(exc, JobSpecError):
        # an option's problem ("--resume DIR: ...") is about the option
        fields = list(dict.fromkeys(f.split()[0] if f.startswith("--") else f for f in exc.fields))
        extra = {"fields": fields, "problems": exc.problems} if len(exc.problems) > 1 else {}
        return str(exc), fields[0] if fields else "job", EXIT_BAD_INPUT, extra
    if isinstance(exc, PlanError):
        return f"invalid plan: {exc}", exc.field, EXIT_BAD_INPUT, {}
    if isinstance(exc, NoFeasiblePlanError):
        return f"no feasible plan: {exc}", exc.field, EXIT_BAD_INPUT, {}
    if isinstance(exc, ShardingPlanError):
        return f"invalid plan: {exc}", "--plan", EXIT_BAD_INPUT, {}
    if isinstance(exc, (NetworkError, ScheduleError)):
        text = str(exc)
        field = text.split(":", 1)[0].split(" ", 1)[0] if text.startswith("network") else "network"
        return f"invalid network: {exc}", field, EXIT_BAD_INPUT, {}
    if isinstance(exc, PlacementError):
        return f"invalid placement: {exc}", "placement", EXIT_BAD_INPUT, {}
    if isinstance(exc, UncalibratedGroupError):
        return f"cannot price this job's collectives: {exc}", "world_size", EXIT_BAD_INPUT, {}
    if isinstance(exc, BindingError):
        return str(exc), BINDING_ENV, EXIT_BAD_INPUT, {}
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {exc}", str(exc.filename or "file"), EXIT_BAD_INPUT, {}
    if isinstance(exc, RegistryUnavailable):  # failed closed: nothing was promoted on a guess
        return f"tracking server unavailable: {exc}", "--tracking-uri", EXIT_FAILED, {}
    if isinstance(exc, LeaseTimeout):
        return f"gave up waiting for another calibration: {exc}", "--lock-timeout-s", EXIT_FAILED, {}
    return None


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Turn input errors into a clear message and exit code instead of a traceback."""
    as_json = wants_json(argv)
    try:
        return main(argv)
    except UsageError as exc:
        return bad_input(exc.message, exc.field, as_json, echo=False)
    except NoModelError as exc:
        return bad_input(exc.message, "hardware_id", as_json, code=EXIT_NO_MODEL, echo=False)
    except Exception as exc:
        known = known_failure(exc)
        if known is None:
            raise
        message, field, code, extra = known
        return bad_input(message, field, as_json, code=code, **extra)


class Main(Protocol):
    def __call__(self, argv: Sequence[str] | None = None) -> int: ...


def entry_point(impl: Callable[[Sequence[str] | None], int]) -> Main:
    """A CLI's `main(argv=None)`: `impl` under `run_main`."""

    def main(argv: Sequence[str] | None = None) -> int:
        return run_main(impl, argv)

    return main


def environment_default(name: str, default: str) -> str:
    """An option's default from the environment, read when the parser is built."""
    return os.environ.get(name) or default
