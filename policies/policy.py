"""Every policy behind one small protocol: options -> priced by an injected estimator -> `Decision`.

TorchRec's planner separates what may be chosen (its enumerator and proposer) from what each
choice costs (its estimator); optuna separates samplers from storages. A policy here does the
same: it names its options and, once they are priced, picks among them and says why; the
estimator that prices an option is passed in, so another cost model (TorchRec's constants, a
user's own, a recorded table) replaces the default without editing the policy. Every priced
candidate stays in the `Decision`, ranked, so a plan shows the whole table of alternatives.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol, TypeVar

from policies.plan import Candidate, Decision

Option = TypeVar("Option")
OptionCo = TypeVar("OptionCo", covariant=True)

# Prices one named option: its predicted time, whether it is feasible (and why not), detail.
Estimator = Callable[[str, Option], Candidate]


class Policy(Protocol[OptionCo]):
    """One decision of a plan."""

    name: str

    def options(self) -> Iterable[tuple[str, OptionCo]]:
        """Every (name, option) the policy may choose, before pricing."""
        ...

    def choose(self, priced: list[Candidate], estimate: Callable[[str, OptionCo], Candidate]) -> Decision:
        """The decision among the priced candidates (a policy may price more, e.g. a search
        starting from the best, through the same `estimate`)."""
        ...


def decide(policy: Policy[Option], estimate: Estimator[Option]) -> Decision:
    """Price every option of `policy` with `estimate` and let the policy choose."""
    return policy.choose([estimate(name, option) for name, option in policy.options()], estimate)


def ranked(candidates: list[Candidate]) -> list[Candidate]:
    """Fastest feasible first; ties to the earlier candidate (a deterministic choice); the
    infeasible last, in their original order."""
    order = {id(c): i for i, c in enumerate(candidates)}
    feasible = sorted((c for c in candidates if c.feasible), key=lambda c: (round(predicted(c), 9), order[id(c)]))
    return feasible + [c for c in candidates if not c.feasible]


def predicted(candidate: Candidate) -> float:
    """A priced candidate's time in milliseconds (a feasible candidate always has one)."""
    if candidate.predicted_ms is None:
        raise ValueError(f"candidate {candidate.name!r} has no predicted time: {candidate.detail.get('reason')}")
    return candidate.predicted_ms


def decision_for(policy: str, chosen: Candidate, candidates: list[Candidate], detail: dict[str, Any]) -> Decision:
    """`policy`'s decision for `chosen` at its predicted time, beside every priced candidate."""
    return Decision(policy, chosen.name, predicted(chosen), candidates, detail)
