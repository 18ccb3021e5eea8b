#!/bin/bash
# Hidden cases: the agent never sees them; they run only in the grading sandbox.
pass=0
[ "$(python3 /app/sum.py 1 2 3)" = "6" ] && pass=$((pass + 1))
[ "$(python3 /app/sum.py 10 -4)" = "6" ] && pass=$((pass + 1))
[ "$(python3 /app/sum.py 7)" = "7" ] && pass=$((pass + 1))
if [ "$pass" = 3 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
