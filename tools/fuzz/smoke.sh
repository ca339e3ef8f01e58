#!/usr/bin/env bash
# Smoke-fuzz every loader harness of tools/fuzz/fuzz_loaders.py for a bounded time each.
#
#   tools/fuzz/smoke.sh                  # 20 s per target
#   FUZZ_SECONDS=5 tools/fuzz/smoke.sh   # seconds per target (clamped to 1..60)
#   FUZZ_TARGETS="bundle jsonl" tools/fuzz/smoke.sh
#
# Seeds come from tools/fuzz/make_seeds.py, written into a temporary directory (removed at
# the end). The Python is $RIFTCO_TRANSFORMER_ORACLE_PYTHON, else the oracle venv
# (~/.cache/riftco-transformer/oracle-venv/bin/python); when it is missing or cannot import
# atheris the script prints "skipped: <reason>" and exits 0. RIFTCO_TRANSFORMER_LIBRARY, when
# set, selects the native library (otherwise the package finds this checkout's build).
# FUZZ_ARTIFACTS=<dir> keeps crash inputs there; RIFTCO_FUZZ_IGNORE passes through (see the
# harness docstring). Exit status: 0 when every target ran clean, 1 when any target crashed
# or failed to run (its log tail, with the traceback and the input in base64, is printed).
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${RIFTCO_TRANSFORMER_ORACLE_PYTHON:-$HOME/.cache/riftco-transformer/oracle-venv/bin/python}
seconds=${FUZZ_SECONDS:-20}
targets=${FUZZ_TARGETS:-bundle checkpoint safetensors jsonl tokenizer_state tokenizer_json}

case $seconds in
  '' | *[!0-9]*) echo "FUZZ_SECONDS must be a whole number of seconds, got '$seconds'" >&2; exit 2 ;;
esac
seconds=$((10#$seconds))
((seconds < 1)) && seconds=1
((seconds > 60)) && seconds=60

if ! command -v "$python" >/dev/null 2>&1; then
  echo "skipped: no python at $python (set RIFTCO_TRANSFORMER_ORACLE_PYTHON)"
  exit 0
fi
if ! "$python" -c 'import atheris' >/dev/null 2>&1; then
  echo "skipped: $python cannot import atheris"
  exit 0
fi

export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
work=$(mktemp -d "${TMPDIR:-/tmp}/riftco-fuzz-smoke.XXXXXX")
trap 'rm -rf "$work"' EXIT
artifacts=${FUZZ_ARTIFACTS:-$work/artifacts}
mkdir -p "$artifacts"

if ! "$python" "$here/make_seeds.py" "$work/seeds" >"$work/seeds.log" 2>&1; then
  echo "FAIL: make_seeds.py could not write the seeds:"
  tail -n 30 "$work/seeds.log"
  exit 1
fi

status=0
for target in $targets; do
  corpus="$work/corpus/$target"
  mkdir -p "$corpus"
  cp "$work/seeds/$target"/* "$corpus/"
  log="$work/$target.log"
  # -timeout: a single input running 10 s is a hang; the outer timeout guards the whole run.
  (cd "$work" && timeout -k 10 $((seconds + 90)) "$python" "$here/fuzz_loaders.py" \
    --target "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/$target-" "$corpus") >"$log" 2>&1
  rc=$?
  stats=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
  if ((rc == 0)) && grep -q '^Done [0-9]* runs' "$log"; then
    echo "ok: $target ($(grep '^Done [0-9]* runs' "$log" | tail -n 1); ${stats:-no stats})"
  else
    status=1
    echo "FAIL: $target (exit status $rc); log tail:"
    grep -v "^INFO: Instrumenting" "$log" | tail -n 40
    ls "$artifacts"/"$target"-* 2>/dev/null | sed 's/^/  input: /'
  fi
done
exit $status
