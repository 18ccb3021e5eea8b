#!/bin/bash
cd /app
out=$(python3 /app/wc.py /tests/sample.txt)
if [ "$out" = "$(cat /tests/expected.txt)" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
