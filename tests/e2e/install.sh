#!/usr/bin/env bash
# Installs the pinned real clients for tests/e2e under .e2e/ (never globally). When npm cannot
# install them, writes why to .e2e/unavailable and exits 0: the suite then runs the rest and
# reports those clients as skipped, with that reason.
set -u
cd "$(dirname "$0")/../.."
PINS=("@openai/codex@0.171.0" "@anthropic-ai/claude-code@2.1.332")
DIR=.e2e
mkdir -p "$DIR"
rm -f "$DIR/unavailable"

installed() {  # every pin present at its version
  local pin name version
  for pin in "${PINS[@]}"; do
    name=${pin%@*}
    version=${pin##*@}
    [ "$(node -p "require('./$DIR/node_modules/$name/package.json').version" 2>/dev/null)" = "$version" ] || return 1
  done
}

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  echo "npm or node is not on PATH" >"$DIR/unavailable"
elif installed; then
  echo "e2e: ${PINS[*]} already installed under $DIR"
elif npm install --prefix "$DIR" --no-save --no-audit --no-fund --loglevel=error "${PINS[@]}" >"$DIR/npm.log" 2>&1 && installed; then
  echo "e2e: installed ${PINS[*]} under $DIR"
else
  echo "npm could not install ${PINS[*]} (registry unreachable?): see $DIR/npm.log" >"$DIR/unavailable"
fi
if [ -f "$DIR/unavailable" ]; then
  echo "e2e: SKIPPING the Codex CLI and Claude Code runs: $(cat "$DIR/unavailable")" >&2
fi

# The openai-agents SDK, pinned, into the Python that runs the suite (`PYTHON`, the Makefile's
# .venv): when pip cannot install it, its runs are skipped and .e2e/unavailable-agents says why.
AGENTS_PIN="openai-agents==0.24.0"
PY=${PYTHON:-.venv/bin/python}
rm -f "$DIR/unavailable-agents"
if [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("openai-agents"))' 2>/dev/null)" = "${AGENTS_PIN#*==}" ]; then
  echo "e2e: $AGENTS_PIN already installed"
elif "$PY" -m pip install --quiet "$AGENTS_PIN" >"$DIR/pip.log" 2>&1; then
  echo "e2e: installed $AGENTS_PIN"
else
  echo "pip could not install $AGENTS_PIN (registry unreachable?): see $DIR/pip.log" >"$DIR/unavailable-agents"
  echo "e2e: SKIPPING the openai-agents runs: $(cat "$DIR/unavailable-agents")" >&2
fi
exit 0
