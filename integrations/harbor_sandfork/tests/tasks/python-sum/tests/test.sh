#!/bin/bash
# The expected sum is computed here, independently of the solution; the build step's
# row count must be in the image.
expected=$(python3 -c "import csv; print(sum(int(r['value']) for r in csv.DictReader(open('/app/data/numbers.csv'))))")
if [ "$(cat /app/rows.txt)" = "200" ] && [ "$(cat /app/answer.txt 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "expected $expected, got $(cat /app/answer.txt 2>/dev/null)"
  echo 0 > /logs/verifier/reward.txt
fi
