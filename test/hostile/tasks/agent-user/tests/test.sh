#!/bin/sh
if [ "$(cat /srv/work/out.txt 2>/dev/null)" = done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
