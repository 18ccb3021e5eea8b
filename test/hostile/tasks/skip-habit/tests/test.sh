#!/bin/bash
# As published verifiers do after installing their tools: the user's own bin folder comes first.
export PATH="$HOME/.local/bin:$PATH"
cd /app
if python3 -m pytest -q -p no:cacheprovider /tests/test_answer.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
