#!/usr/bin/env bash
# Makes this checkout ready to run: build tools, npm packages, the agent and the TypeScript
# build, then `sandgym setup` (Debian packages, kernel checks, base layers). Idempotent: each
# step is skipped when its result is already there and current.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "sandgym needs root (namespaces, cgroups, mounts): run this as root" >&2
  exit 2
fi

has_toolchain() {
  command -v cc >/dev/null && command -v make >/dev/null && [ -n "$(find /usr/lib -name libc.a -print -quit 2>/dev/null)" ]
}
if ! has_toolchain; then
  echo "prepare: installing the C toolchain for the static agent" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc make libc6-dev >/dev/null
fi

if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "prepare: installing npm packages" >&2
  npm ci --no-audit --no-fund --loglevel=error
fi

echo "prepare: building the agent and the TypeScript sources" >&2
npm run --silent build
chmod +x dist/src/cli/main.js

# Put `sandgym` on PATH, pointing at this checkout (what `npm link` does, without a reinstall).
bin="$(npm prefix -g)/bin/sandgym"
if [ "$(readlink "$bin" 2>/dev/null)" != "$PWD/dist/src/cli/main.js" ]; then
  mkdir -p "$(dirname "$bin")"
  ln -sfn "$PWD/dist/src/cli/main.js" "$bin"
  echo "prepare: linked $bin" >&2
fi

node dist/src/cli/main.js setup "$@"

case " $* " in
*" --for-tests "*) bash scripts/harness-venv.sh ;;
esac
