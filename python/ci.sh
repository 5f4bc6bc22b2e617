#!/usr/bin/env bash
# The Python client's suite (python/): a venv in .cache/py, the package with its
# `test` extra installed from PyPI (versions pinned by python/ci-constraints.txt),
# then pytest against a real broker, registry, demo records server and writ owner
# (KAFKA_BROKERS / SCHEMA_REGISTRY_URL when set, else `node scripts/kafka-up.ts`).
# Extra arguments go to pytest, e.g. `bash python/ci.sh -k vectors`.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "python/ci.sh: Python >= 3.10 is required")'
echo "python: $("$PY" --version)"

VENV=.cache/py
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c python/ci-constraints.txt "./python[test]"
# The tests run the owner, the records server and the local stack from the checkout's node_modules.
if [ ! -x node_modules/.bin/node ]; then
  npm install --no-audit --no-fund
fi
"$VENV/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | grep -iE '^(writ-client|confluent-kafka|cryptography|pydantic|pydantic-ai-slim|langgraph|langchain-core|openai-agents|pytest) ' || true

cd python
exec ../"$VENV"/bin/python -m pytest -q -p no:cacheprovider "$@"
