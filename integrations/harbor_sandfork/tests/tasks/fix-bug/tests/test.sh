#!/bin/bash
# The image's USER is worker: the solution ran as worker and must have kept the file its.
if python3 /tests/test_calc.py && [ "$(stat -c %U /srv/calc/calc.py)" = "worker" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
