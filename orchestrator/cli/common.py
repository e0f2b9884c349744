"""What every CLI shares: options, fingerprinting, champion lookup, error exits.

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

from orchestrator import registry
from orchestrator.cluster import HardwareFingerprint, local_node_fingerprint
from orchestrator.lease import LeaseTimeout
from orchestrator.progress import say
from policies.plan import PlanError
from policies.sharders import NoFeasiblePlanError
from predictors.collective_curves import UncalibratedGroupError
from predictors.network import NetworkError
from probes.vocabulary.chunks import ScheduleError
from probes.vocabulary.jobspec import JobSpecError
from probes.vocabulary.placement import PlacementError
from probes.vocabulary.table_shards import ShardingPlanError

EXIT_BAD_INPUT, EXIT_NO_MODEL, EXIT_FAILED = 2, 3, 1

# Upper bounds of time options: a calibration or nightly budget beyond a week, or a model age
# beyond ten years, is a typo (and would overflow the timeouts computed from it).
MAX_BUDGET_S = 7 * 24 * 3600.0
MAX_AGE_DAYS = 3650.0


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


def job_parser(module: str, doc: str) -> ArgumentParser:
    """The parser of `python -m <module>`, described by the first line of its `doc`, with the
    required --job option and the common ones (`add_common`)."""
    parser = ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    parser.add_argument("--job", required=True)
    add_common(parser)
    return parser


def _option_named(message: str) -> str:
    """The option an argparse message is about: `argument --budget-s: ...`, `... required: --job`,
    `unrecognized arguments: --x`, or the first --option it mentions."""
    if message.startswith("argument "):
        return message[len("argument ") :].split(":", 1)[0].split("/")[0].strip()
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
            f"expected a calibration directory (.autotune/calibrations/<stamp>, holding fingerprint.json and "
            f"measurements.jsonl), got {text!r}" + (f" (no {', '.join(missing)} there)" if path.is_dir() else "")
        )
    return text


def add_lock_timeout(parser: argparse.ArgumentParser) -> None:
    """--lock-timeout-s of the commands that calibrate under the hardware's promotion lease."""
    parser.add_argument(
        "--lock-timeout-s",
        type=number_in(0.0, 4 * MAX_BUDGET_S, minimum_allowed=True, unit="seconds"),
        default=None,
        help="wait this long for another calibration of this hardware to finish (default: 3 x the budget + 300 s)",
    )


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)"
    )
    parser.add_argument("--ray-address", help="Ray cluster address (default: $RAY_ADDRESS, else a local cluster)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def fingerprint(ray_address: str | None, start_ray: bool) -> HardwareFingerprint:
    """The whole Ray cluster's fingerprint when Ray is (or must be) in use, else this node's.

    A single local node fingerprints the same either way, so planning and predicting need not
    start Ray just to learn which models to load.
    """
    if start_ray or ray_address or os.environ.get("RAY_ADDRESS"):
        from orchestrator import ray_runtime
        from orchestrator.cluster import cluster_fingerprint

        ray_runtime.connect(ray_address)
        return cluster_fingerprint()
    return HardwareFingerprint([local_node_fingerprint()])


def champion_or_exit(hardware_id: str) -> registry.RegisteredBundle:
    found = registry.get_alias(hardware_id, registry.CHAMPION)
    if found is None:
        message = (
            f"no champion model for hardware {hardware_id}; run `python -m orchestrator.cli.calibrate` "
            f"or `python -m orchestrator.autotune --job J` first"
        )
        say(message)
        raise NoModelError(message)
    return found


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


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Turn input errors into a clear message and exit code instead of a traceback."""
    as_json = wants_json(argv)
    try:
        return main(argv)
    except UsageError as exc:
        return bad_input(exc.message, exc.field, as_json, echo=False)
    except NoModelError as exc:
        return bad_input(exc.message, "hardware_id", as_json, code=EXIT_NO_MODEL, echo=False)
    except JobSpecError as exc:
        # an option's problem ("--resume DIR: ...") is about the option
        fields = list(dict.fromkeys(f.split()[0] if f.startswith("--") else f for f in exc.fields))
        extra = {"fields": fields, "problems": exc.problems} if len(exc.problems) > 1 else {}
        return bad_input(str(exc), fields[0] if fields else "job", as_json, **extra)
    except PlanError as exc:
        return bad_input(f"invalid plan: {exc}", exc.field, as_json)
    except NoFeasiblePlanError as exc:
        return bad_input(f"no feasible plan: {exc}", exc.field, as_json)
    except ShardingPlanError as exc:
        return bad_input(f"invalid plan: {exc}", "--plan", as_json)
    except (NetworkError, ScheduleError) as exc:
        text = str(exc)
        field = text.split(":", 1)[0].split(" ", 1)[0] if text.startswith("network") else "network"
        return bad_input(f"invalid network: {exc}", field, as_json)
    except PlacementError as exc:
        return bad_input(f"invalid placement: {exc}", "placement", as_json)
    except UncalibratedGroupError as exc:
        return bad_input(f"cannot price this job's collectives: {exc}", "world_size", as_json)
    except FileNotFoundError as exc:
        return bad_input(f"file not found: {exc}", str(exc.filename or "file"), as_json)
    except registry.RegistryUnavailable as exc:  # failed closed: nothing was promoted on a guess
        return bad_input(f"tracking server unavailable: {exc}", "--tracking-uri", as_json, code=EXIT_FAILED)
    except LeaseTimeout as exc:
        return bad_input(
            f"gave up waiting for another calibration: {exc}", "--lock-timeout-s", as_json, code=EXIT_FAILED
        )


class Main(Protocol):
    def __call__(self, argv: Sequence[str] | None = None) -> int: ...


def entry_point(impl: Callable[[Sequence[str] | None], int]) -> Main:
    """A CLI's `main(argv=None)`: `impl` under `run_main`."""

    def main(argv: Sequence[str] | None = None) -> int:
        return run_main(impl, argv)

    return main
