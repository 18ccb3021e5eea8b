#!/bin/sh
printf 'from even import is_even\n\n\ndef test_even():\n    assert is_even(2)\n\n\ndef test_odd():\n    assert not is_even(3)\n' > /app/test_even.py
