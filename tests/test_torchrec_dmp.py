"""The TorchRec plan file a user loads, applied for real: `DistributedModelParallel` shards an
`EmbeddingBagCollection` by it on 2 gloo ranks and trains a step (CPU, fbgemm-gpu-cpu).

Row-wise tables are left out here: TorchRec reduce-scatters their pooled output, which gloo
does not implement (NCCL does); the record and its loading are the same for every type."""

import json
import tempfile

import pytest

pytest.importorskip("torchrec")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from spawned import exit_worker  # noqa: E402

from policies.torchrec_plans import feature_name, load_torchrec_plan, torchrec_plan_record  # noqa: E402
from probes.vocabulary.jobspec import JobSpec  # noqa: E402

PLAN = [1, 0, {"type": "column_wise", "ranks": [1, 0]}, {"type": "data_parallel"}, 0]


def _rank(rank: int, init: str, out: str, record: dict) -> None:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        configs = [EmbeddingBagConfig(**bag) for bag in record["embedding_bags"]]
        ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        plan = load_torchrec_plan(record, ebc)
        model = DistributedModelParallel(
            ebc,
            env=ShardingEnv.from_process_group(dist.group.WORLD),
            device=torch.device("cpu"),
            plan=plan,
            sharders=[EmbeddingBagCollectionSharder()],
        )
        keys = [f for bag in record["embedding_bags"] for f in bag["feature_names"]]
        batch, generator = 4, torch.Generator().manual_seed(rank)
        rows = {f: bag["num_embeddings"] for bag in record["embedding_bags"] for f in bag["feature_names"]}
        lengths = torch.ones(len(keys) * batch, dtype=torch.int64)
        values = torch.cat([torch.randint(0, rows[k], (batch,), generator=generator) for k in keys])
        features = KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)
        pooled = model(features)  # a KeyedTensor (TorchRec's lazy awaitable resolves on use)
        pooled.values().sum().backward()
        json.dump({"shape": list(pooled.values().shape), "keys": pooled.keys()}, open(f"{out}/{rank}.json", "w"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_worker()


@pytest.mark.slow
def test_distributed_model_parallel_shards_by_the_plan_file(tiny_job_dict):
    job = JobSpec.from_dict(tiny_job_dict)
    record = json.loads(json.dumps(torchrec_plan_record(job, PLAN, device_type="cpu")))
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(f"{tmp}/init", tmp, record), nprocs=2)
        results = [json.load(open(f"{tmp}/{r}.json")) for r in range(2)]
    width = sum(t.embedding_dim for t in job.tables)
    for result in results:
        assert result["shape"] == [4, width]  # every table's pooled embedding for the local batch
        assert sorted(result["keys"]) == sorted(feature_name(t.name) for t in job.tables)  # grouped by sharding type
