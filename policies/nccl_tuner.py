"""What NCCL should run per collective and message size, from measured choices: the CSV that
NVIDIA's example tuner plugin reads (nccl `ext-tuner/example`, `NCCL_TUNER_CONFIG_FILE`).

Input: rows of the NCCL choice probe (`probes.nccl_choice`): each collective timed on a group
of `nodes` x `ranks` at a ladder of sizes, under every candidate (algorithm, protocol) pair and
under NCCL's own choice. Per (collective, nodes, ranks, size) the fastest pair wins; a rule is
written only where it beats NCCL's own choice beyond both measurements' spread (their
inter-quartile ranges do not overlap), so the file overrides NCCL where the hardware showed it
wrong and leaves every other call to NCCL. Each measured size stands for the sizes up to the
geometric midpoints to its neighbours (the first from 0, the last up to `MAX_BYTES`);
neighbouring sizes with the same winner become one rule. `nNodes` and `nRanks` are the measured
group's, exactly: another topology matches no rule and NCCL decides.

Line format (10 fields): collective_type,min_bytes,max_bytes,algorithm,protocol,channels,
nNodes,nRanks,numPipeOps,regBuff; channels, numPipeOps and regBuff are -1 (NCCL's default,
any, any): they were not varied.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

from probes.vocabulary.nccl import ALGORITHMS, AUTO, NCCL_CHOICE_FAMILY, PROTOCOLS, TUNER_COLLECTIVES
from probes.vocabulary.records import Measurement

MAX_BYTES = 4294967295  # the example plugin's "every size" upper bound
HEADER = "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff"
_COLLECTIVE_OF = {v: k for k, v in TUNER_COLLECTIVES.items()}


class TunerFileError(ValueError):
    """A tuner CSV line that NCCL's example plugin would not read as meant (names the line)."""


@dataclass(frozen=True)
class TunerRule:
    """One line of the tuner CSV: `op` (ours, e.g. all_reduce) in [min_bytes, max_bytes] on
    `nodes` x `ranks` runs `algorithm` / `protocol`."""

    op: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    nodes: int
    ranks: int
    channels: int = -1
    pipe_ops: int = -1
    reg_buff: int = -1

    def line(self) -> str:
        fields = (
            TUNER_COLLECTIVES[self.op],
            self.min_bytes,
            self.max_bytes,
            self.algorithm,
            self.protocol,
            self.channels,
            self.nodes,
            self.ranks,
            self.pipe_ops,
            self.reg_buff,
        )
        return ",".join(str(f) for f in fields)


@dataclass(frozen=True)
class SizeChoice:
    """At one measured size: NCCL's own time and the fastest forced pair's (seconds)."""

    op: str
    nodes: int
    ranks: int
    nbytes: int
    best: tuple[str, str]
    best_s: float
    auto_s: float | None

    @property
    def speedup(self) -> float | None:
        """NCCL's own time over the winner's (None: NCCL's own choice was not measured)."""
        return self.auto_s / self.best_s if self.auto_s and self.best_s > 0 else None


def _bounds(row: Measurement) -> tuple[float, float]:
    """A measurement's inter-quartile interval around its time (spread_s is q3 - q1)."""
    half = max(row.spread_s, 0.0) / 2
    return row.median_s - half, row.median_s + half


def size_choices(rows: Iterable[Measurement]) -> list[SizeChoice]:
    """Per (collective, nodes, ranks, size): the winner, where a forced pair beat NCCL's own
    choice beyond both spreads (or NCCL's own choice was not measured); sizes where NCCL's
    choice held are left out."""
    cells: dict[tuple[str, int, int, int], dict[tuple[str, str], Measurement]] = defaultdict(dict)
    for row in rows:
        if row.family != NCCL_CHOICE_FAMILY:
            continue
        p = row.params
        key = (row.op, int(p.get("nodes", 1)), int(row.world_size), int(p["bytes"]))
        pair = (str(p["algo"]), str(p["proto"]))
        held = cells[key].get(pair)
        if held is None or row.median_s < held.median_s:
            cells[key][pair] = row
    out = []
    for (op, nodes, ranks, nbytes), by_pair in sorted(cells.items()):
        auto = by_pair.pop((AUTO, AUTO), None)
        if not by_pair:
            continue
        pair, best = min(by_pair.items(), key=lambda kv: kv[1].median_s)
        if auto is not None and not _bounds(best)[1] < _bounds(auto)[0]:
            continue  # not clearly faster than NCCL's own choice: leave it to NCCL
        out.append(SizeChoice(op, nodes, ranks, nbytes, pair, best.median_s, auto.median_s if auto else None))
    return out


def _edges(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """[min, max] bytes each measured size stands for: to the geometric midpoints between it
    and its neighbours (integer, contiguous), from 0 to `MAX_BYTES`."""
    cuts = [int(math.sqrt(a * b)) for a, b in zip(sizes, sizes[1:])]
    lows = [0] + [c + 1 for c in cuts]
    highs = cuts + [MAX_BYTES]
    return list(zip(lows, highs))


def tuner_rules(rows: Iterable[Measurement], choices: Sequence[SizeChoice] | None = None) -> list[TunerRule]:
    """The CSV's rules from the NCCL choice rows (see the module docstring); `choices`: their
    `size_choices`, when the caller has them already."""
    rows = list(rows)
    measured: dict[tuple[str, int, int], set[int]] = defaultdict(set)
    for row in rows:
        if row.family == NCCL_CHOICE_FAMILY:
            measured[(row.op, int(row.params.get("nodes", 1)), int(row.world_size))].add(int(row.params["bytes"]))
    wins = {(c.op, c.nodes, c.ranks, c.nbytes): c.best for c in (size_choices(rows) if choices is None else choices)}
    rules: list[TunerRule] = []
    for (op, nodes, ranks), sizes in sorted(measured.items()):
        ladder = sorted(sizes)
        for nbytes, (low, high) in zip(ladder, _edges(ladder)):
            pair = wins.get((op, nodes, ranks, nbytes))
            if pair is None:
                continue
            last = rules[-1] if rules else None
            if (
                last
                and (last.op, last.nodes, last.ranks, last.algorithm, last.protocol) == (op, nodes, ranks, *pair)
                and last.max_bytes + 1 == low
            ):
                rules[-1] = TunerRule(op, last.min_bytes, high, pair[0], pair[1], nodes, ranks)
            else:
                rules.append(TunerRule(op, low, high, pair[0], pair[1], nodes, ranks))
    return rules


def tuner_csv(rules: Sequence[TunerRule], provenance: Sequence[str] = ()) -> str:
    """The file's text: `provenance` and the format as `#` comments, then one rule a line."""
    lines = [f"# {line}" for line in provenance]
    lines += [f"# {HEADER}", "# channels -1: NCCL's default; nNodes / nRanks: the measured group's; -1: any"]
    lines += [rule.line() for rule in rules]
    return "\n".join(lines) + "\n"


def parse_tuner_csv(text: str) -> list[TunerRule]:
    """Read a tuner CSV back as the example plugin reads it (8-10 fields a line, `#` comments
    and blank lines skipped); a line it would misread raises `TunerFileError` naming it."""
    rules = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(",")
        if not 8 <= len(fields) <= 10:
            raise TunerFileError(f"line {number}: {len(fields)} fields, expected 8-10 ({HEADER})")
        kind, algorithm, protocol = fields[0], fields[3], fields[4]
        if kind not in _COLLECTIVE_OF:
            raise TunerFileError(f"line {number}: collective_type {kind!r}, expected one of {sorted(_COLLECTIVE_OF)}")
        if algorithm not in ALGORITHMS or protocol not in PROTOCOLS:
            raise TunerFileError(
                f"line {number}: algorithm/protocol {algorithm!r}/{protocol!r}, expected one of {ALGORITHMS} / {PROTOCOLS}"
            )
        try:
            numbers = [int(f) for f in fields[1:3] + fields[5:]]
        except ValueError:
            raise TunerFileError(f"line {number}: a numeric field is not an integer: {line!r}") from None
        low, high, channels, nodes, ranks, *rest = numbers
        if not 0 <= low <= high:
            raise TunerFileError(f"line {number}: min_bytes {low} > max_bytes {high}")
        rest += [-1] * (2 - len(rest))
        rules.append(TunerRule(_COLLECTIVE_OF[kind], low, high, algorithm, protocol, nodes, ranks, channels, *rest))
    return rules
