"""The host's other load while a job's steps are timed: what the launcher reports beside them."""

from __future__ import annotations

import os
import time

import pytest

from benchmarks.e2e_accuracy import LaunchLog
from orchestrator.launch import LaunchResult
from orchestrator.quiet_host import CpuMark, cpu_mark, other_share


def test_other_share_is_the_hosts_busy_time_less_the_ranks_own_over_its_cores():
    start, end = CpuMark(100.0, 5.0, 10.0), CpuMark(103.0, 6.0, 12.0)  # 3 busy core-seconds over 2 s
    assert other_share(start, end, [1.0, 1.0], cores=2) == pytest.approx(0.25)  # 1 of 4 core-seconds
    assert other_share(start, end, [1.0], cores=2) == pytest.approx(0.5)  # a rank on another host is not subtracted
    assert other_share(start, end, [2.0, 1.5], cores=2) == 0.0  # tick rounding below zero clamps
    assert other_share(start, start, [], cores=2) == 0.0  # no span, no share


def test_a_mark_counts_this_process_inside_the_hosts_busy_time():
    start = cpu_mark()
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    end = cpu_mark()
    own = end.own_s - start.own_s
    assert own >= 0.15
    assert end.host_busy_s - start.host_busy_s >= own - 0.05  # within /proc/stat's tick rounding
    # over every core of the host, as the launcher counts it: a busy host's other cores are inside
    # its busy time (over one core, a build beside this test read 1.34)
    assert 0.0 <= other_share(start, end, [own], cores=os.cpu_count() or 1) <= 1.0


def result(ms: float, share: float | None) -> LaunchResult:
    return LaunchResult(ms, 20, [ms] * 20, 1.0, 0.5, 0.5, True, share)


def test_a_launch_log_times_each_launch_and_keeps_its_share():
    log = LaunchLog(2)
    assert log.timed(0, result(10.0, 0.02)) == 10.0
    assert log.timed(1, result(20.0, None)) == 20.0  # a launch whose rank 0 reported none
    assert log.timed(1, result(21.0, 0.10)) == 21.0
    assert log.other_shares == [[0.02], [None, 0.10]]
    assert log.result() == {"host_other_share_median": pytest.approx(0.06), "host_other_share_max": 0.10}
    assert LaunchLog(1).result() == {"host_other_share_median": None, "host_other_share_max": None}
