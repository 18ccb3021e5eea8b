#!/bin/bash
# Writes 1 to the reward file when the file holds exactly the asked-for line, else 0.
if [ "$(cat /app/hello.txt 2>/dev/null)" = "hello sandgym" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
