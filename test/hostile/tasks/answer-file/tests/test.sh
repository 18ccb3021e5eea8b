#!/bin/bash
# The expected answer is hidden with the tests; the agent's file must hold the same bytes.
if cmp -s /app/answer.txt /tests/expected.txt; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
