#!/bin/bash
# The value of key 42, computed here as the service computes it.
expected=$(python3 -c '
import hashlib
d = b"42"
for _ in range(3000):
    d = hashlib.sha256(d).digest()
print(d.hex())')
if [ "$(cat /app/answer.txt 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
