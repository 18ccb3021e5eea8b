#!/bin/bash
# Terminal-Bench's run-tests.sh template (uv venv .tbench-testing; uv pip install pytest; uv run
# pytest), offline: a venv in the working directory with pytest put into its site-packages.
if [ "$PWD" = "/" ]; then
    echo "Error: No working directory set. Please set a WORKDIR in your Dockerfile before running this script."
    exit 1
fi
python3 -m venv --without-pip .tbench-testing
source .tbench-testing/bin/activate
SITE=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp -r /usr/lib/python3/dist-packages/. "$SITE/"
python -m pytest $TEST_DIR/test_outputs.py -rA
