#!/bin/bash
# run from WORKDIR, as Terminal-Bench does: the tests import the agent's module from there
python3 -m pytest "$TEST_DIR/test_outputs.py" -rA -p no:cacheprovider
