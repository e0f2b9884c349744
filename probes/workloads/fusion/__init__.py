"""Horizontal fusion of repetitive training jobs (HFTA): B copies of one model that differ only
in fusible hyper-parameters trained as one job, every operator batched over the model axis.

- `hfta`: the fused models (`torch.func` stacking + `vmap`), per-model dropout rates, the
  fused loss;
- `fused_optim`: SGD with momentum, Adam and AdamW over stacked parameters with a
  hyper-parameter vector per model;
- `models`: the reference workloads (PointNet-style classifier, small CNN, small
  transformer encoder) on synthetic data generated locally;
- `trainer`: the training loop of B fused models (`FusedTrainer`).

The probe that measures one fusion width is `probes.fusion`.
"""
