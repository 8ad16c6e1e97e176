#!/usr/bin/env bash
# The README's commands timed as a new user meets them on a CPU machine, in one command:
#  1. a fresh clone of this checkout's HEAD (committed files only) in $FP8LAB_CLEAN;
#  2. `bash scripts/setup.sh` there with an empty pip cache (every wheel downloaded; the CPU torch
#     wheel comes from wherever pip finds it);
#  3. the same command again (must find its stamp and stop);
#  4. `pip check`;
#  5. the README's test command verbatim (set-up re-run, then the fast tier);
#  6. the slow tier (`pytest -m slow`), unless FP8LAB_CHECK_SLOW=0: steps 5 and 6 are what .ci/run runs.
# HOME is a fresh folder for every step, so the user's own Jupyter kernel `fp8lab` is left alone.
# Each step's seconds go to $OUT/steps.tsv, all output to $OUT/log.txt (the clone's and home's paths
# shown as <clone> and <home>), a summary with the machine's cores and load to $OUT/result.md.
#
#   OUT=benchmarks/logs/cpu-setup-<when> bash benchmarks/cpu_setup_check.sh
set -uo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/cpu_setup_check}
CLEAN=${FP8LAB_CLEAN:-/tmp/fp8lab-cpu-clean}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: >"$OUT/log.txt"
printf 'step\tseconds\texit\n' >"$OUT/steps.tsv"
load() { cut -d' ' -f1-3 /proc/loadavg; }
FAILED=0
summary() {  # result.md from the steps so far (rewritten after each step: a cut-off run keeps what it measured)
{
  echo "# README's commands on a CPU machine, from a fresh clone"
  echo
  echo "command: \`bash benchmarks/cpu_setup_check.sh\`, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "checkout: $(git -C "$CLEAN" rev-parse --short HEAD) ; $(python3 --version 2>&1) ; $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
  local busy=""
  awk -v l="$START_LOAD" -v n="$(nproc)" 'BEGIN { split(l, a, " "); exit !(a[1] > n) }' \
    && busy=" (above the core count: other jobs shared the machine, so every figure is slower than on an idle one)"
  echo "load average (1, 5, 15 min): $START_LOAD at the start, $(load) at the end$busy"
  echo
  steps_table
  echo
  for t in tests_fast tests_slow; do
    line=$(awk -v t="$t" '/^=== /{ cur = $2 } cur == t":" && /(passed|failed).* in [0-9.]+s/ { last = $0 } END { print last }' "$OUT/log.txt")
    [ -n "$line" ] && echo "$t: \`${line//=/}\`"
  done
  echo
  [ "$FAILED" = 0 ] && echo "result: ${1:-all steps passed}" || echo "result: a step failed (log.txt)"
} >"$OUT/result.md"
}

step_note() { echo " (load average $(load))"; }
after_step() {  # the clone's and home's paths hidden in the log; result.md rewritten (a cut-off run keeps what it measured)
  sed -i "s#$CLEAN-home#<home>#g; s#$CLEAN#<clone>#g" "$OUT/log.txt"
  summary "the steps so far (the run goes on)"
}
. "$SRC/benchmarks/steps.sh"

START_LOAD=$(load)
rm -rf "$CLEAN" "$CLEAN-home" && mkdir -p "$CLEAN-home"
git clone -q "$SRC" "$CLEAN"
export HOME="$CLEAN-home" PIP_CACHE_DIR
PIP_CACHE_DIR=$(mktemp -d)
step setup bash scripts/setup.sh
rm -rf "$PIP_CACHE_DIR"
step setup_again bash scripts/setup.sh
step pip_check .venv/bin/python -m pip check
step tests_fast bash -c 'bash scripts/setup.sh && .venv/bin/python -m pytest -m "not slow"'
if [ "${FP8LAB_CHECK_SLOW:-1}" != 0 ]; then
  step tests_slow .venv/bin/python -m pytest -m slow
fi
summary
cat "$OUT/result.md"
exit "$FAILED"

