#!/bin/bash
printf 'def answer():\n    return 42\n' > /app/solution.py
