"""Ray Tune sweeps run fused: trials sampled from a Tune search space are grouped by the
fusion-width policy, each group trains as one Tune trial of B fused models, and every
sampled trial keeps its own identity in what is reported and returned.

The user supplies what an ordinary Tune sweep has: a search space (`tune.loguniform`,
`tune.choice`, `tune.grid_search`, constants), a number of samples, a workload (their own
model factory and data as a `FusionWorkload`, or a reference workload's name), epochs. `sample_trials` draws the configs with Tune's own variant
generator; `policies.fusion_width.partition_trials` groups trials whose infusible settings
(batch size, optimizer, architecture switches) agree; `run_sweep` runs the groups through
`tune.Tuner`. Each group trial reports, per epoch, every member's validation loss and
accuracy under `trials/<trial_id>/...`, and `val_loss` = its best member's, which is what a
Tune scheduler sees: a Tune scheduler stops whole groups. To stop single trials, `run_sweep`
takes `halving=MemberHalving(...)`: ASHA's rule applied per trial across all groups (the rungs
held by one small actor), a stopped trial cut out of its fused job.
`fused=False` runs the same sweep one model per Tune trial, the baseline it is timed against.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import ray
import torch
from ray import tune
from ray.tune.search.variant_generator import generate_variants

from policies.fusion_width import FUSIBLE_KEYS, partition_trials
from probes.workloads.fusion.fused_optim import FusedHyperParams
from probes.workloads.fusion.hfta import fused_cross_entropy
from probes.workloads.fusion.models import FusionWorkload, batches, workload
from probes.workloads.fusion.trainer import FusedTrainer

VALIDATION_SAMPLES = 256


@dataclass
class TrialOutcome:
    """One sampled trial: its config, the fused group it ran in, its metrics per epoch."""

    trial_id: str
    config: dict[str, Any]
    group: int
    group_width: int
    history: list[dict[str, float]] = field(default_factory=list)

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1] if self.history else {}


@dataclass
class SweepOutcome:
    fused: bool
    wall_s: float
    groups: list[list[str]]
    trials: list[TrialOutcome]
    # per group, its training throughput (samples/s of all its members) in each epoch while
    # it ran at its full width (a group that halving shrank counts until it shrank)
    group_samples_per_s: list[list[float]] = field(default_factory=list)

    def measured_samples_per_s(self, width: int) -> float | None:
        """The median per-epoch throughput of the groups `width` wide, their first epoch left
        out where there are later ones (it pays the allocator's and the caches' warm-up)."""
        rates = [
            r
            for group, history in zip(self.groups, self.group_samples_per_s)
            if len(group) == width
            for r in (history[1:] if len(history) > 1 else history)
        ]
        return float(np.median(rates)) if rates else None

    def best(self, metric: str = "val_loss") -> TrialOutcome:
        return min((t for t in self.trials if metric in t.final), key=lambda t: t.final[metric])


@dataclass(frozen=True)
class MemberHalving:
    """Asynchronous successive halving (ASHA, as Tune's `AsyncHyperBandScheduler` applies it to
    whole trials) applied to each trial inside the fused groups: rungs at grace_period·η^k
    epochs below max_t; a trial reaching a rung goes on only if its validation loss is among
    the best 1/η of all losses recorded at that rung so far, across every group. A stopped
    trial is cut out of its fused job, which shrinks and runs faster."""

    grace_period: int = 1
    reduction_factor: float = 3.0
    max_t: int = 100

    def __post_init__(self) -> None:
        if self.grace_period < 1 or self.max_t < self.grace_period or self.reduction_factor <= 1:
            raise ValueError(f"halving: expected 1 <= grace_period <= max_t and reduction_factor > 1, got {self}")

    def rungs(self) -> list[int]:
        out, t = [], float(self.grace_period)
        while t < self.max_t:
            out.append(int(round(t)))
            t *= self.reduction_factor
        return out


class RungBoard:
    """The rungs' recorded losses, shared by every group of a sweep (run as a Ray actor)."""

    def __init__(self, rule: MemberHalving) -> None:
        self.rule = rule
        self.rungs = set(rule.rungs())
        self.recorded: dict[int, list[float]] = {}

    def judge(self, epoch: int, losses: dict[str, float]) -> dict[str, bool]:
        """For each trial reaching `epoch`: go on (True) or stop."""
        if epoch not in self.rungs:
            return {tid: True for tid in losses}
        decisions = {}
        for tid, loss in losses.items():
            recorded = self.recorded.setdefault(epoch, [])
            recorded.append(loss)
            decisions[tid] = loss <= float(np.nanpercentile(recorded, 100.0 / self.rule.reduction_factor))
        return decisions


def sample_trials(param_space: dict[str, Any], num_samples: int, seed: int = 0) -> list[dict[str, Any]]:
    """`num_samples` configs from a Tune search space, as `tune.Tuner` would draw them
    (grid axes crossed with every sample)."""
    random_state = np.random.RandomState(seed)
    trials = []
    for _ in range(num_samples):
        for _, config in generate_variants(param_space, random_state=random_state):
            trials.append(dict(config))
    return trials


def _group_hyper(configs: Sequence[dict[str, Any]]) -> FusedHyperParams:
    def vector(key: str, default: float) -> list[float]:
        return [float(c.get(key, default)) for c in configs]

    return FusedHyperParams(
        lr=vector("lr", 1e-3),
        weight_decay=vector("weight_decay", 0.0),
        momentum=vector("momentum", 0.0),
        beta1=vector("beta1", 0.9),
        beta2=vector("beta2", 0.999),
    )


def train_group(config: dict[str, Any], work: FusionWorkload | None = None, board: Any = None) -> None:
    """Tune function trainable: the members of one fused group, trained together. `work` is
    the user's own model factory and data (bound with `tune.with_parameters`); without it the
    reference workload named in the config. With a `board` (a `RungBoard` actor) members are
    stopped one by one by successive halving and cut out of the fused job."""
    members = list(config["members"])
    configs = [m["config"] for m in members]
    first = configs[0]
    work = work or workload(config["workload"])
    batch_size = int(first.get("batch_size", work.batch_size))
    device = trial_device()
    trainer = FusedTrainer.build(
        work,
        seeds=[int(c.get("seed", i)) for i, c in enumerate(configs)],
        hyper=_group_hyper(configs),
        optimizer=str(first.get("optimizer", "adam")),
        dropouts=[float(c.get("dropout", 0.0)) for c in configs],
        device=device,
    )
    stream = batches(work, batch_size, int(config["data_seed"]))
    val_x, val_y = (t.to(device) for t in next(batches(work, VALIDATION_SAMPLES, int(config["data_seed"]) + 1)))
    for epoch in range(int(config["epochs"])):
        # the epoch's batches drawn before its steps are timed: the throughput the fusion
        # model predicts is training's, as its probe measures it (drawing data untimed)
        data = [(x.to(device), y.to(device)) for x, y in itertools.islice(stream, int(config["steps_per_epoch"]))]
        synchronize(device)
        t0 = time.perf_counter()
        for x, y in data:
            trainer.step(x, y)
        synchronize(device)
        samples_per_s = len(members) * batch_size * len(data) / (time.perf_counter() - t0)
        trainer.fused.eval()
        with torch.no_grad():
            logits = trainer.fused(val_x)
            _, losses = fused_cross_entropy(logits, val_y)
            accuracy = (logits.argmax(dim=-1) == val_y).float().mean(dim=1)
        trainer.fused.train()
        report = {
            m["trial_id"]: {"val_loss": float(losses[i]), "val_accuracy": float(accuracy[i])}
            for i, m in enumerate(members)
        }
        width = len(members)
        if board is not None:
            go_on = ray.get(board.judge.remote(epoch + 1, {t: r["val_loss"] for t, r in report.items()}))
            for tid, keep in go_on.items():
                report[tid]["stopped"] = 0.0 if keep else 1.0
            kept = [i for i, m in enumerate(members) if go_on[m["trial_id"]]]
            if len(kept) < len(members) and kept:
                trainer.keep(kept)
            members = [members[i] for i in kept]
        tune.report(
            {
                "trials": report,
                "val_loss": min(r["val_loss"] for r in report.values()),
                "epoch": epoch + 1,
                "width": width,
                "samples_per_s": samples_per_s,
            }
        )
        if not members:
            return


@contextlib.contextmanager
def quiet_tune() -> Iterator[None]:
    """Tune's own output off for one fit: its newer console output prints the experiment's
    configuration table and paths even at verbose=0 (the older one honours it); the sweep's
    progress and results are ours to print (orchestrator.progress)."""
    before = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = before


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def trial_device() -> torch.device:
    """The trial's device: the GPU Ray gave it (Ray sets CUDA_VISIBLE_DEVICES, so it is cuda:0),
    else the CPU."""
    gpus = ray.get_gpu_ids() if ray.is_initialized() else []
    return torch.device("cuda", 0) if gpus and torch.cuda.is_available() else torch.device("cpu")


def trial_resources(device_kind: str, cpus_per_trial: float) -> dict[str, float]:
    """What one fused group asks Tune for: a GPU and its CPUs on a GPU cluster (the group's
    models share the GPU, which is what fusing buys), CPUs alone otherwise."""
    if device_kind == "cuda":
        return {"cpu": cpus_per_trial, "gpu": 1}
    return {"cpu": cpus_per_trial}


def run_sweep(
    work: str | FusionWorkload,
    trials: Sequence[dict[str, Any]],
    width: int,
    epochs: int,
    steps_per_epoch: int,
    storage: str | Path,
    name: str,
    data_seed: int = 0,
    fused: bool = True,
    scheduler: Any = None,
    cpus_per_trial: float = 1.0,
    halving: MemberHalving | None = None,
    device_kind: str = "cpu",
) -> SweepOutcome:
    """Run `trials` (configs) as fused groups of at most `width` (or one per Tune trial when
    `fused` is False) and return every trial's own history. `work` is a reference workload's
    name or the user's own `FusionWorkload` (a model factory, a batch function, a batch size):
    the training loop is this module's, the model is theirs. `halving` stops single trials
    inside the groups (`MemberHalving`); a Tune `scheduler` acts on whole groups. With
    `device_kind="cuda"` every group trial asks for a GPU and trains there."""
    if isinstance(work, str):
        work = workload(work)  # a clear error for an unknown name before anything starts
    ids = [f"trial_{i:03d}" for i in range(len(trials))]
    groups = partition_trials(trials, width if fused else 1, FUSIBLE_KEYS)
    group_of = {ids[i]: index for index, group in enumerate(groups) for i in group}
    group_members = [[{"trial_id": ids[i], "config": dict(trials[i])} for i in g] for g in groups]
    board = ray.remote(num_cpus=0)(RungBoard).remote(halving) if halving is not None else None
    tuner = tune.Tuner(
        tune.with_resources(
            tune.with_parameters(train_group, work=work, board=board), trial_resources(device_kind, cpus_per_trial)
        ),
        param_space={
            "workload": work.name,
            "epochs": epochs,
            "steps_per_epoch": steps_per_epoch,
            "data_seed": data_seed,
            "members": tune.grid_search(group_members),
        },
        tune_config=tune.TuneConfig(metric="val_loss", mode="min", scheduler=scheduler),
        run_config=tune.RunConfig(storage_path=str(Path(storage).resolve()), name=name, verbose=0),
    )
    t0 = time.perf_counter()
    with quiet_tune():
        results = tuner.fit()
    wall = time.perf_counter() - t0
    if board is not None:
        ray.kill(board)
    outcomes: dict[str, TrialOutcome] = {}
    rates: dict[str, list[float]] = {}  # by the group's first trial id
    for result in results:
        if result.error:
            raise RuntimeError(f"fused group failed: {result.error}") from result.error
        members = result.config["members"]
        frame = result.metrics_dataframe
        full = frame[frame["width"] == len(members)] if "width" in frame else frame.iloc[0:0]
        rates[members[0]["trial_id"]] = [float(v) for v in full.get("samples_per_s", [])]
        for m in members:
            tid = m["trial_id"]
            history = []
            for _, row in frame.iterrows():
                loss = row.get(f"trials/{tid}/val_loss")
                if loss is None or np.isnan(loss):
                    continue  # stopped by halving before this epoch
                history.append(
                    {
                        "epoch": int(row["epoch"]),
                        "val_loss": float(loss),
                        "val_accuracy": float(row[f"trials/{tid}/val_accuracy"]),
                    }
                )
            outcomes[tid] = TrialOutcome(tid, m["config"], group_of[tid], len(members), history)
    named = [[ids[i] for i in g] for g in groups]
    return SweepOutcome(
        fused, wall, named, [outcomes[t] for t in ids if t in outcomes], [rates.get(g[0], []) for g in named]
    )
