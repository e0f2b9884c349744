"""Validation of a sweep job (`probes.vocabulary.sweep_job` gives the schema): the model or the
user's factory, the search space in Tune's domains, the run's sizes; every problem found, each
naming its field, raised together as one `JobSpecError`, as for the other job files."""

from __future__ import annotations

import math
from typing import Any

from probes.vocabulary.jobspec import JobSpecError
from probes.vocabulary.jobspec_validation import JobSpecValidator
from probes.vocabulary.sweep_job import (
    INTEGER_KEYS,
    LIST_DOMAINS,
    OPTIMIZERS,
    RANGE_DOMAINS,
    SWEEP_FIELDS,
    SWEEP_KEYS,
    SweepJob,
)

# The reference workloads: probes.workloads.fusion.models.WORKLOADS (a test keeps them equal).
REFERENCE_MODELS = ("cnn", "pointnet", "transformer")


class SweepValidator(JobSpecValidator):
    """JobSpecValidator's field checks, for a `workload: sweep` job."""

    def sweep_job(self, data: dict) -> SweepJob:
        """A `workload: sweep` job (probes.vocabulary.sweep_job gives the schema)."""
        for key in data:
            if key not in SWEEP_FIELDS:
                self.problems.append(f"{key}: unknown field; allowed fields are {sorted(SWEEP_FIELDS)}")
        if ("model" in data) == ("factory" in data):
            self.problems.append(
                f"model: give exactly one of model (one of {list(REFERENCE_MODELS)}) and factory (module:callable)"
            )
        ref = data.get("model", data.get("factory"))
        if "model" in data and data["model"] not in REFERENCE_MODELS:
            self.fail("model", "a reference workload", data["model"], ", ".join(REFERENCE_MODELS))
        if "factory" in data:
            module, _, attribute = str(data["factory"]).partition(":")
            if not isinstance(data["factory"], str) or not module or not attribute:
                self.fail("factory", "an import path module:callable returning a FusionWorkload", data["factory"])
        space = self.search_space(data.get("search_space"))
        trials = self.int_field(data, "trials", "")
        optimizer = data.get("optimizer", "adam")
        if optimizer not in OPTIMIZERS:
            self.fail("optimizer", "an optimizer the fused trainer has", optimizer, ", ".join(OPTIMIZERS))
        sizes = {
            key: self.int_field(data, key, "", default=default)
            for key, default in (("epochs", 3), ("steps_per_epoch", 20), ("max_width", 64))
        }
        free = data.get("memory_free_gb")
        if free is not None and not self.number(free, "memory_free_gb", "GiB to leave free", allow_minimum=True):
            free = None
        seed = self.int_field(data, "seed", "", default=0)
        name = self._job_name(data.get("name", "sweep"))
        if self.problems:
            raise JobSpecError(self.problems)
        return SweepJob(
            workload_ref=str(ref),
            search_space=space,
            trials=trials,
            optimizer=str(optimizer),
            memory_free_gb=float(free) if free is not None else None,
            seed=seed,
            name=name,
            raw=dict(data),
            **sizes,
        )

    def search_space(self, data: Any) -> dict[str, Any]:
        """Each entry a constant or one Tune domain, `{uniform|loguniform|randint: [low, high]}`
        or `{choice|grid_search: [value, ...]}`, over a key the fused trainer reads."""
        if not isinstance(data, dict) or not data:
            self.fail("search_space", "a mapping of hyper-parameters to values or Tune domains", data)
            return {}
        domains = (
            ", ".join(f"{{{d}: [low, high]}}" for d in RANGE_DOMAINS)
            + ", "
            + ", ".join(f"{{{d}: [value, ...]}}" for d in LIST_DOMAINS)
        )
        for key, value in data.items():
            path = f"search_space.{key}"
            if key not in SWEEP_KEYS:
                self.problems.append(f"{path}: unknown hyper-parameter; allowed: {', '.join(SWEEP_KEYS)}")
                continue
            if not isinstance(value, dict):
                self._space_values(path, key, [value])
                continue
            if len(value) != 1 or next(iter(value)) not in RANGE_DOMAINS + LIST_DOMAINS:
                self.fail(path, "one Tune domain", value, domains)
                continue
            domain, values = next(iter(value.items()))
            if not isinstance(values, list) or not values:
                self.fail(f"{path}.{domain}", "a non-empty list", values)
            elif domain in LIST_DOMAINS:
                self._space_values(f"{path}.{domain}", key, values)
            elif key in INTEGER_KEYS and domain != "randint":
                self.fail(path, "an integer domain (randint, choice or grid_search) or an integer", value)
            elif len(values) != 2 or not all(
                not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) for v in values
            ):
                self.fail(f"{path}.{domain}", "[low, high], two finite numbers", values)
            elif not values[0] < values[1]:
                self.fail(f"{path}.{domain}", "[low, high] with low < high", values)
            elif domain == "loguniform" and values[0] <= 0:
                self.fail(f"{path}.{domain}", "a positive low bound", values[0])
            elif domain == "randint" and not all(isinstance(v, int) for v in values):
                self.fail(f"{path}.{domain}", "integer bounds", values)
        return dict(data)

    def _space_values(self, path: str, key: str, values: list[Any]) -> None:
        """Records each value that is not a number (an integer for `INTEGER_KEYS`, >= 1 for a
        batch size)."""
        for v in values:
            integer = key in INTEGER_KEYS
            if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
                self.fail(path, "an integer" if integer else "a number", v)
            elif not math.isfinite(v) or (key == "batch_size" and v < 1):
                self.fail(path, "a batch size >= 1" if key == "batch_size" else "a finite number", v)
