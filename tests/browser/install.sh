#!/usr/bin/env bash
# Installs the browser test's npm package (package.json / package-lock.json) into
# tests/browser/node_modules (git-ignored): playwright-core, the library that drives Debian's
# chromium through the dashboard (dashboard_test.mjs). It downloads no browser. Idempotent: a
# stamp of the lock file skips a second install. Exits 1 when the install fails: without the
# package browser_dashboard fails, naming this script.
set -uo pipefail
cd "$(dirname "$0")"
stamp=node_modules/.troupe-installed
if [ -f "$stamp" ] && [ -d node_modules/playwright-core ] && cmp -s "$stamp" package-lock.json; then
  echo "browser test packages: installed"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "npm is not installed (scripts/setup.sh --test installs nodejs and npm)" >&2
  exit 1
fi
# playwright-core has no install script: no browser is downloaded (the test runs /usr/bin/chromium).
if npm ci --no-audit --no-fund --loglevel=error; then
  cp package-lock.json "$stamp"
  echo "browser test packages: installed"
  exit 0
fi
echo "npm ci failed in $(pwd): the browser test needs playwright-core (is the npm registry reachable?)" >&2
exit 1
