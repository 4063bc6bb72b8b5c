"""The demo's warm worker: loads the prepared features, trains a gradient-boosted model
with scikit-learn (pandas for the held-out report) and keeps both in memory. Then either
serves questions about them on 127.0.0.1:7000 (one per connection; `--serve`), or answers
one (`--ask THRESHOLD`).

A question is a decision threshold: the answer is precision, recall and F1 of the model
on the held-out rows at that threshold.
"""
import json
import socket
import sys

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier

data = np.load("/job/data.npz")
features, labels = data["features"], data["label"]
split = int(len(labels) * 0.8)
model = HistGradientBoostingClassifier(max_iter=60, learning_rate=0.15, random_state=0)
model.fit(features[:split], labels[:split])
held_out = pd.DataFrame({"p": model.predict_proba(features[split:])[:, 1], "truth": labels[split:]})


def evaluate(threshold: float) -> dict:
    predicted = held_out["p"] >= threshold
    tp = int((predicted & (held_out["truth"] == 1)).sum())
    precision = tp / max(int(predicted.sum()), 1)
    recall = tp / max(int(held_out["truth"].sum()), 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-12)
    return {"threshold": threshold, "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4)}


if sys.argv[1] == "--ask":
    print(json.dumps(evaluate(float(sys.argv[2]))))
    sys.exit(0)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", 7000))
server.listen(64)
open("/job/ready", "w").close()
while True:
    conn, _ = server.accept()
    question = conn.recv(1024).decode()
    conn.sendall(json.dumps(evaluate(float(question))).encode())
    conn.close()
