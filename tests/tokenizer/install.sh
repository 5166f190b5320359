#!/usr/bin/env bash
# Installs the test-only npm packages of package.json / package-lock.json into
# tests/tokenizer/node_modules (git-ignored): the Hugging Face tokenizers library's Node binding
# (the reference the tokenizer tests compare troupe's ids with) and tokenizer.json files of
# released models (Llama 3, GPT-4o; GPT-2's vocabulary and merges). Idempotent: a stamp of the
# lock file skips a second install. Exit 77 (ctest: skipped) when npm cannot reach its registry.
set -uo pipefail
cd "$(dirname "$0")"
stamp=node_modules/.troupe-installed
if [ -f "$stamp" ] && cmp -s "$stamp" package-lock.json; then
  echo "tokenizer test packages: installed"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "SKIPPED: npm is not installed (scripts/setup.sh --test installs nodejs and npm)"
  exit 77
fi
if npm ci --no-audit --no-fund --loglevel=error; then
  cp package-lock.json "$stamp"
  echo "tokenizer test packages: installed"
  exit 0
fi
if ! timeout 60 npm ping >/dev/null 2>&1; then
  echo "SKIPPED: the npm registry is unreachable; the tokenizer reference tests need its packages"
  exit 77
fi
echo "npm ci failed although the registry answers" >&2
exit 1
