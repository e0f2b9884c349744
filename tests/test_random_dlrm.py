from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.records import Measurement
from probes.workloads.random_dlrm import TABLES_PER_RANK, random_dlrm_job, random_dlrm_tasks


def test_tasks_are_valid_deterministic_and_sized_like_the_anchor():
    tasks = random_dlrm_tasks(20, world_size=2, seed=3, scale=0.05)
    assert [t.name for t in tasks] == [f"random{i}" for i in range(20)]
    assert random_dlrm_job(5, 2, seed=3, scale=0.05) == random_dlrm_job(5, 2, seed=3, scale=0.05)
    assert random_dlrm_job(5, 2, seed=3) != random_dlrm_job(5, 2, seed=4)
    for t in tasks:
        assert isinstance(t, JobSpec)
        assert 0.7 * 2 * TABLES_PER_RANK - 1 <= len(t.tables) <= 1.3 * 2 * TABLES_PER_RANK + 1
        assert all(100 <= tb.num_embeddings <= 100_000 for tb in t.tables)
    # The mix varies: several batch sizes, dims and distribution kinds across tasks.
    assert len({t.batch_size for t in tasks}) >= 3
    assert len({tb.embedding_dim for t in tasks for tb in t.tables}) == 4
    assert {tb.distribution.kind for t in tasks for tb in t.tables} == {"uniform", "zipf", "profile"}


def test_task_shaped_training_probes_take_the_sharders_plans() -> None:
    """Every table-wise task-shaped training probe is placed by the classic sharders in turn,
    so the step model is fitted on the plans the policies price (#26: the sharder-placed steps
    leaned low where random placements were half of them)."""
    from orchestrator.calibrate import place_by_sharder
    from policies.sharders import SHARDERS
    from probes.training import task_is_mixed, training_specs
    from probes.vocabulary.jobspec import JobSpec

    specs = training_specs(48, seed=0, world=2, place_task=place_by_sharder)
    by_sharder = [i for i in range(1, 48, 2) if not task_is_mixed(i // 2)]
    assert len(by_sharder) == 12
    for k, i in enumerate(by_sharder):
        tables = JobSpec.from_dict(specs[i].params["job"]).tables
        sharder = list(SHARDERS)[k % len(SHARDERS)]
        assert specs[i].params["table_to_rank"] == list(SHARDERS[sharder](tables, 2, float("inf"), seed=k)), sharder
    # Without a placer the same probes sit on random ranks (and the rest of the list is unchanged).
    plain = training_specs(48, seed=0, world=2)
    assert [s.params["job"] for s in plain] == [s.params["job"] for s in specs]
    assert [s.params["table_to_rank"] for i, s in enumerate(plain) if i not in by_sharder] == [
        s.params["table_to_rank"] for i, s in enumerate(specs) if i not in by_sharder
    ]


def test_every_batch_size_is_probed_table_wise_before_any_is_probed_mixed() -> None:
    """The first four task probes are table-wise at each batch size, the next four mixed at each:
    neither a batch size nor a plan kind is only ever seen with the other (issue #26)."""
    from probes.training import training_specs
    from probes.workloads.random_dlrm import BATCH_SIZES

    specs = training_specs(16, seed=0, world=2)
    tasks = [s.params for i, s in enumerate(specs) if i % 2]
    kinds = [(t["job"]["batch_size"], any(isinstance(e, dict) for e in t["table_to_rank"])) for t in tasks]
    assert kinds[:4] == [(b, False) for b in BATCH_SIZES]
    assert [b for b, _ in kinds[4:]] == list(BATCH_SIZES)
    assert sum(mixed for _, mixed in kinds[4:]) >= 3  # a third of each mixed plan's tables are split


def test_tasks_run_at_full_size_unless_the_memory_cannot_hold_them() -> None:
    from probes.workloads.random_dlrm import fitting_scale

    biggest = max(sum(t.bytes for t in spec.tables) for spec in random_dlrm_tasks(4, 2, seed=5))
    assert fitting_scale(range(4), 2, 5, memory_bytes=9 * biggest) == 1.0
    assert fitting_scale(range(4), 2, 5, memory_bytes=0) == 1.0  # unknown memory: full size
    smaller = fitting_scale(range(4), 2, 5, memory_bytes=9 * biggest // 3)
    assert smaller < 1.0
    assert max(sum(t.bytes for t in s.tables) for s in random_dlrm_tasks(4, 2, 5, smaller)) * 9 <= 9 * biggest // 3


def test_small_transformer_probes_span_the_task_widths_smallest_first() -> None:
    """A short calibration measures two small stacks: they are the smallest width and the
    next, not two random draws, so the step overhead is never fitted on large steps alone."""
    from probes.training import SMALL_HIDDEN, transformer_training_specs
    from probes.vocabulary.transformer_spec import random_transformer

    specs = transformer_training_specs(24, seed=0, world=2)
    small = [s.params["transformer"] for i, s in enumerate(specs) if i % 4 == 0]
    assert [(t["hidden"], t["layers"]) for t in small[:3]] == [(64, 1), (128, 2), (256, 1)]
    assert {t["hidden"] for t in small} == set(SMALL_HIDDEN)
    task_widths = {random_transformer(i, 2, 1, seed).hidden for i in range(40) for seed in range(3)}
    assert min(SMALL_HIDDEN) <= min(task_widths) and max(SMALL_HIDDEN) >= max(task_widths)


def test_a_stored_steps_kind_and_plan_are_read_back_from_its_row() -> None:
    """A stored step keeps only its job's name and plan: the kind read back from the name is
    the kind its index was given, and the table-wise task steps are the task probes whose
    plans put every table on one rank (the mixed ones split some)."""
    from probes.training import job_kind, probe_kind, table_wise_task, task_is_mixed, training_specs

    specs = training_specs(32, seed=0, world=2)
    rows = [Measurement("dlrm_step", s.params, 0.01, 0.0, 5) for s in specs]
    assert [job_kind(r.params["job"]["name"]) for r in rows] == [probe_kind(i) for i in range(32)]
    table_wise = [i for i, r in enumerate(rows) if table_wise_task(r)]
    mixed = [i for i in range(1, 32, 2) if task_is_mixed(i // 2)]
    assert table_wise and mixed and set(table_wise) | set(mixed) == set(range(1, 32, 2))
    split = [i for i in mixed if any(isinstance(p, dict) for p in rows[i].params["table_to_rank"])]
    assert split and set(table_wise).isdisjoint(split)


def test_light_probes_put_task_tables_under_little_work() -> None:
    """Between the tiny-table and the task probes, light ones: the first 1..all tables of the
    generator's task at their index, at a small batch, so a step of many large tables is
    measured where its kernels do not hide what it costs beyond them (#26)."""
    from probes.training import CALIBRATION_TASK_STREAM, LIGHT_BATCH_SIZES, probe_kind, task_indices, training_specs

    specs = training_specs(48, seed=0, world=2)
    assert [probe_kind(i) for i in range(4)] == ["overhead", "task", "light", "task"]
    light = [i for i in range(48) if probe_kind(i) == "light"]
    assert len(light) == 12 and task_indices(48) == sorted(light + list(range(1, 48, 2)))
    counts = []
    for i in light:
        job = specs[i].params["job"]
        tables = random_dlrm_job(i, 2, seed=CALIBRATION_TASK_STREAM)["tables"]
        assert job["tables"] == tables[: len(job["tables"])]
        assert job["batch_size"] in LIGHT_BATCH_SIZES
        assert len(specs[i].params["table_to_rank"]) == len(job["tables"])
        JobSpec.from_dict(job)
        counts.append(len(job["tables"]) / len(tables))
    assert min(counts) < 0.5 < max(counts)  # few tables and most of a task's
    tiny = [specs[i].params["job"] for i in range(48) if probe_kind(i) == "overhead"]
    assert max(t["num_embeddings"] for job in tiny for t in job["tables"]) < 2000
