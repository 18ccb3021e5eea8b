#!/bin/sh
printf 'def riddle():\n    return "What has keys but cannot open locks?"\n' > /app/riddle.py
echo 'a piano' > /app/answer.txt
