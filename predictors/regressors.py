"""Small ML regressors reduced to plain arrays, so a fitted model is data, not code.

sklearn fits them; prediction runs on the exported arrays in numpy, so loading a model from
a shared registry never unpickles anything. Two families:
- `ArrayMLP`: standardised inputs, ReLU hidden layers, linear output (from MLPRegressor);
- `ArrayTrees`: a gradient-boosted ensemble of regression trees (from
  GradientBoostingRegressor), evaluated for all trees at once, level by level.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ArrayMLP:
    kind = "mlp"

    def __init__(self, mean: np.ndarray, scale: np.ndarray, weights: list[np.ndarray], biases: list[np.ndarray]):
        self.mean, self.scale, self.weights, self.biases = mean, scale, weights, biases

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, seed: int = 0, hidden: tuple[int, ...] = (64, 64)) -> "ArrayMLP":
        from sklearn.neural_network import MLPRegressor

        mean, scale = x.mean(axis=0), x.std(axis=0)
        scale[scale == 0] = 1.0
        net = MLPRegressor(
            hidden_layer_sizes=hidden,
            alpha=1e-3,
            learning_rate_init=3e-3,
            max_iter=3000,
            early_stopping=True,
            validation_fraction=0.15,
            n_iter_no_change=50,
            random_state=seed,
        )
        net.fit((x - mean) / scale, y)
        return cls(mean, scale, [w.copy() for w in net.coefs_], [b.copy() for b in net.intercepts_])

    def predict(self, x: np.ndarray) -> np.ndarray:
        h = (np.asarray(x, dtype=np.float64) - self.mean) / self.scale
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = h @ w + b
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0.0)
        return h[:, 0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "weights": [w.tolist() for w in self.weights],
            "biases": [b.tolist() for b in self.biases],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ArrayMLP":
        return cls(
            np.asarray(d["mean"]),
            np.asarray(d["scale"]),
            [np.asarray(w) for w in d["weights"]],
            [np.asarray(b) for b in d["biases"]],
        )


class ArrayTrees:
    """Padded per-tree node arrays; leaves point to themselves so every tree walks `depth` steps."""

    kind = "gbt"

    def __init__(
        self,
        init: float,
        rate: float,
        left: np.ndarray,
        right: np.ndarray,
        feature: np.ndarray,
        threshold: np.ndarray,
        value: np.ndarray,
        depth: int,
    ):
        self.init, self.rate, self.depth = init, rate, depth
        self.left, self.right, self.feature, self.threshold, self.value = left, right, feature, threshold, value

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, seed: int = 0, trees: int = 400, depth: int = 4) -> "ArrayTrees":
        from sklearn.ensemble import GradientBoostingRegressor

        gbt = GradientBoostingRegressor(
            n_estimators=trees,
            max_depth=depth,
            learning_rate=0.05,
            subsample=0.8,
            min_samples_leaf=3,
            random_state=seed,
        )
        gbt.fit(x, y)
        nodes = max(e[0].tree_.node_count for e in gbt.estimators_)
        n = len(gbt.estimators_)
        left = np.tile(np.arange(nodes), (n, 1))
        right = left.copy()
        feature = np.zeros((n, nodes), dtype=np.int64)
        threshold = np.zeros((n, nodes))
        value = np.zeros((n, nodes))
        for i, est in enumerate(gbt.estimators_[:, 0]):
            t = est.tree_
            c = t.node_count
            internal = t.children_left[:c] >= 0
            left[i, :c] = np.where(internal, t.children_left[:c], np.arange(c))
            right[i, :c] = np.where(internal, t.children_right[:c], np.arange(c))
            feature[i, :c] = np.where(internal, t.feature[:c], 0)
            threshold[i, :c] = np.where(internal, t.threshold[:c], 0.0)
            value[i, :c] = t.value[:c, 0, 0]
        init = float(np.ravel(gbt.init_.predict(x[:1]))[0])
        return cls(init, float(gbt.learning_rate), left, right, feature, threshold, value, depth)

    def predict(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        n_rows, n_trees = len(x), len(self.left)
        trees = np.arange(n_trees)[None, :]
        node = np.zeros((n_rows, n_trees), dtype=np.int64)
        rows = np.arange(n_rows)[:, None]
        for _ in range(self.depth):
            f = self.feature[trees, node]
            go_left = x[rows, f] <= self.threshold[trees, node]
            node = np.where(go_left, self.left[trees, node], self.right[trees, node])
        return self.init + self.rate * self.value[trees, node].sum(axis=1)

    ARRAYS = {"left": np.int64, "right": np.int64, "feature": np.int64, "threshold": np.float64, "value": np.float64}

    def to_dict(self) -> dict[str, Any]:
        arrays = {name: getattr(self, name).tolist() for name in self.ARRAYS}
        return {"kind": self.kind, "init": self.init, "rate": self.rate, "depth": self.depth, **arrays}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ArrayTrees":
        arrays = {name: np.asarray(d[name], dtype=dtype) for name, dtype in cls.ARRAYS.items()}
        return cls(d["init"], d["rate"], depth=d["depth"], **arrays)


RegressorKind = type[ArrayMLP] | type[ArrayTrees]
REGRESSORS: dict[str, RegressorKind] = {ArrayMLP.kind: ArrayMLP, ArrayTrees.kind: ArrayTrees}


def regressor_from_dict(d: dict[str, Any]) -> ArrayMLP | ArrayTrees:
    if d.get("kind") not in REGRESSORS:
        raise ValueError(f"unknown regressor kind {d.get('kind')!r}; known: {sorted(REGRESSORS)}")
    return REGRESSORS[d["kind"]].from_dict(d)
