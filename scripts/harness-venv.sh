#!/usr/bin/env bash
# The published harnesses (Harbor, Terminal-Bench, SWE-bench) that the golden tests hold
# sandgym's graders against, in .venv/ of this checkout; python/requirements-test.txt says why it
# is installed --no-deps. Run by `scripts/prepare.sh --for-tests`. Idempotent: the venv is made
# anew only when the lock or the interpreter changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# harbor and terminal-bench declare Python >= 3.12: one is taken where the machine has it
# (pyenv's), else Debian's 3.11, on which the golden tests say what they cannot run.
pyenv_root="$(pyenv root 2>/dev/null || true)"
python=
for candidate in "${SANDGYM_TEST_PYTHON:-}" python3.12 python3.13 \
  "$pyenv_root"/versions/3.12*/bin/python3 "$pyenv_root"/versions/3.1[3-9]*/bin/python3 \
  /usr/bin/python3; do
  # ensurepip is what `python -m venv` needs to put pip in the venv
  if [ -n "$candidate" ] && "$candidate" -c 'import ensurepip' 2>/dev/null; then
    python="$(command -v "$candidate")"
    break
  fi
done
if [ -z "$python" ]; then
  echo "harness-venv: no Python with venv support: apt-get install python3-venv, or set SANDGYM_TEST_PYTHON" >&2
  exit 2
fi

stamp="$python $(sha256sum python/requirements-test.txt | cut -d' ' -f1)"
[ "$(cat .venv/.sandgym-stamp 2>/dev/null)" = "$stamp" ] && exit 0
echo "harness-venv: installing the published harnesses into .venv ($("$python" --version))" >&2
rm -rf .venv
"$python" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
  --ignore-requires-python -r python/requirements-test.txt
echo "$stamp" >.venv/.sandgym-stamp
