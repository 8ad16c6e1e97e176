# Sourced by cpu_setup_check.sh and gpu_setup_check.sh: what their timed steps share.
#   step NAME COMMAND...  runs COMMAND in $CLEAN, its output appended to $OUT/log.txt and "NAME<TAB>seconds<TAB>exit"
#                         to $OUT/steps.tsv; a failure sets FAILED=1 and later steps still run. A script may define
#                         step_note (text after the step's header line in the log) and after_step NAME RC.
#   steps_table           the markdown table of $OUT/steps.tsv.
step() {
  local name=$1 t0 rc; shift
  echo "=== $name: $*$(declare -F step_note >/dev/null && step_note)" >>"$OUT/log.txt"
  t0=$(date +%s.%N)
  (cd "$CLEAN" && "$@") >>"$OUT/log.txt" 2>&1; rc=$?
  printf '%s\t%s\t%s\n' "$name" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')" "$rc" >>"$OUT/steps.tsv"
  [ "$rc" = 0 ] || FAILED=1
  if declare -F after_step >/dev/null; then after_step "$name" "$rc"; fi
  echo "[$(basename "$0" .sh)] $name: exit $rc"
}

steps_table() {
  echo "| step | seconds | exit |"
  echo "|---|---|---|"
  tail -n +2 "$OUT/steps.tsv" | awk -F'\t' '{ printf "| %s | %s | %s |\n", $1, $2, $3 }'
}
