"""Prepares the demo's dataset while the packages install (with the system's numpy, on one
core): 1.5 M transactions with 16 signals and a label, then the features a pipeline would
precompute: rank-normalized signals, windowed means and per-customer aggregates."""
import sys

import numpy as np

ROWS, SIGNALS, CUSTOMERS, WINDOWS = 1_500_000, 16, 50_000, (8, 64, 512, 4096)

rng = np.random.default_rng(7)
x = rng.standard_normal((ROWS, SIGNALS)).astype(np.float32)
x[:, :4] = np.cumsum(x[:, :4], axis=0) / 50.0
weights = rng.standard_normal(SIGNALS).astype(np.float32)
score = x @ weights + 0.5 * np.sin(3 * x[:, 4]) * x[:, 5] + rng.standard_normal(ROWS) * 0.5
label = (score > np.quantile(score, 0.8)).astype(np.int8)
customer = rng.integers(0, CUSTOMERS, ROWS)

columns = [x]
ranks = np.empty((ROWS, 8), dtype=np.float32)
for j in range(8):
    ranks[np.argsort(x[:, j], kind="stable"), j] = np.linspace(0, 1, ROWS, dtype=np.float32)
columns.append(ranks)
csum = np.cumsum(np.vstack([np.zeros((1, 4)), x[:, :4]]), axis=0)
for w in WINDOWS:
    mean = (csum[w:] - csum[:-w]) / w
    columns.append(np.vstack([np.repeat(mean[:1], w - 1, axis=0), mean]).astype(np.float32))
count = np.bincount(customer, minlength=CUSTOMERS).clip(1)
for j in range(4):
    total = np.bincount(customer, weights=x[:, j], minlength=CUSTOMERS)
    square = np.bincount(customer, weights=x[:, j].astype(np.float64) ** 2, minlength=CUSTOMERS)
    mean = total / count
    std = np.sqrt(np.maximum(square / count - mean**2, 0))
    top = np.full(CUSTOMERS, -np.inf)
    np.maximum.at(top, customer, x[:, j])
    columns.append(np.stack([mean[customer], std[customer], top[customer]], axis=1).astype(np.float32))
features = np.hstack(columns)
np.savez(sys.argv[1], features=features, label=label)
print(f"dataset: {ROWS} rows x {features.shape[1]} features", flush=True)
