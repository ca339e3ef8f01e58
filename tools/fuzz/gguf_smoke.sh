#!/usr/bin/env bash
# Builds the GGUF libFuzzer target (tools/fuzz/gguf_fuzzer.cpp) with clang++, ASan and UBSan,
# and fuzzes it for a bounded time from the seeds of tools/fuzz/gguf_seeds.py.
#
#   tools/fuzz/gguf_smoke.sh                   # 20 s of fuzzing
#   FUZZ_SECONDS=5 tools/fuzz/gguf_smoke.sh    # seconds (clamped to 1..60)
#
# The build goes into a temporary directory (removed at the end) unless FUZZ_BUILD_DIR=DIR
# names one to keep: there the fuzzer binary is reused while it is newer than every source
# it is built from (a long run builds with this script, then runs DIR/gguf_fuzzer itself; see
# tools/fuzz/README.md). CXX selects the compiler (default clang++). When the compiler is
# missing or cannot link a -fsanitize=fuzzer program, or python3 is missing, the script
# prints "skipped: <reason>" and exits 0. Before fuzzing it replays the seeds and checks that
# each parses and each tokenizer seed builds its tokenizer (seeds that stopped exercising the
# tokenizer path would make the smoke vacuous). FUZZ_ARTIFACTS=DIR keeps crash inputs there.
# Exit status: 0 when the run was clean, 1 on a build failure, a seed that no longer does
# its job, or a finding (the log tail is printed, with the input in base64), 2 on bad usage.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cxx=${CXX:-clang++}
seconds=${FUZZ_SECONDS:-20}

case $seconds in
  '' | *[!0-9]*) echo "FUZZ_SECONDS must be a whole number of seconds, got '$seconds'" >&2; exit 2 ;;
esac
seconds=$((10#$seconds))
((seconds < 1)) && seconds=1
((seconds > 60)) && seconds=60

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "skipped: no C++ compiler '$cxx' (clang++ with libFuzzer is needed; set CXX)"
  exit 0
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "skipped: no python3 to write the seeds"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/riftco-gguf-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
build=${FUZZ_BUILD_DIR:-$work/build}
mkdir -p "$build"
artifacts=${FUZZ_ARTIFACTS:-$work/artifacts}
mkdir -p "$artifacts"

# libFuzzer present? (clang without compiler-rt's libFuzzer fails this link.)
printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
  'extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }' \
  >"$work/probe.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$work/probe.cpp" -o "$work/probe" \
  >"$work/probe.log" 2>&1; then
  echo "skipped: $cxx cannot link a -fsanitize=fuzzer,address,undefined program ($(head -n 1 "$work/probe.log"))"
  exit 0
fi

# OpenMP (the dequantizer's parallel loop) when clang's libomp is there; else the pragmas
# are ignored and the loop runs serially (the kernels are the same either way).
openmp=(-fopenmp)
printf '%s\n' 'int main() {' '#pragma omp parallel' '  { }' '}' >"$work/omp.cpp"
if ! "$cxx" -fopenmp "$work/omp.cpp" -o "$work/omp" >/dev/null 2>&1; then
  openmp=(-Wno-unknown-pragmas)
fi

if [[ -f /usr/lib/x86_64-linux-gnu/libpcre2-8.a ]]; then
  pcre2=(/usr/lib/x86_64-linux-gnu/libpcre2-8.a)
else
  pcre2=(-lpcre2-8)
fi

sources=(
  tools/fuzz/gguf_fuzzer.cpp
  src/interchange/gguf_reader.cpp
  src/interchange/gguf_dequantize.cpp
  src/interchange/gguf_tokenizer.cpp
  src/data/pretrained_tokenizer.cpp
  src/data/pretokenizer.cpp
)
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
  -fno-sanitize-recover=undefined -I"$root/include" -I"$root/src" "${openmp[@]}")
binary=$build/gguf_fuzzer

# Rebuild when any source or header the target uses is newer than the binary.
stale=1
if [[ -x $binary ]]; then
  stale=0
  while IFS= read -r -d '' file; do
    if [[ $file -nt $binary ]]; then stale=1; break; fi
  done < <(find "${sources[@]/#/$root/}" "$root/include/riftco_transformer" "$root/src/data/pair_map.hpp" \
    "$here/gguf_smoke.sh" -type f -print0)
fi
if ((stale)); then
  build_start=$SECONDS
  pids=()
  for source in "${sources[@]}"; do
    object=$build/$(basename "${source%.cpp}").o
    # -fsanitize=fuzzer on a library TU only adds coverage instrumentation (no main).
    "$cxx" "${flags[@]}" -c "$root/$source" -o "$object" >"$object.log" 2>&1 &
    pids+=($!)
    # Two compilers at a time: a shared 2-core machine.
    if ((${#pids[@]} >= 2)); then
      wait "${pids[0]}"
      pids=("${pids[@]:1}")
    fi
  done
  failed=0
  for pid in "${pids[@]}"; do wait "$pid"; done
  for source in "${sources[@]}"; do
    object=$build/$(basename "${source%.cpp}").o
    if [[ ! -s $object ]]; then
      failed=1
      echo "FAIL: compiling $source:"
      tail -n 30 "$object.log"
    fi
  done
  ((failed)) && exit 1
  if ! "$cxx" "${flags[@]}" "$build"/*.o "${pcre2[@]}" -o "$binary" >"$build/link.log" 2>&1; then
    echo "FAIL: linking the fuzzer:"
    tail -n 30 "$build/link.log"
    exit 1
  fi
  echo "built $binary in $((SECONDS - build_start)) s (${openmp[0]})"
fi

if ! python3 "$here/gguf_seeds.py" "$work/seeds" >"$work/seeds.log" 2>&1; then
  echo "FAIL: gguf_seeds.py could not write the seeds:"
  tail -n 30 "$work/seeds.log"
  exit 1
fi

# The seeds still do their job: every one parses, every tokenizer seed builds a tokenizer.
if ! RIFTCO_GGUF_FUZZ_VERBOSE=1 "$binary" -runs=0 "$work/seeds"/* >"$work/replay.log" 2>&1; then
  echo "FAIL: replaying the seeds:"
  grep -v '^INFO:' "$work/replay.log" | tail -n 40
  exit 1
fi
# libFuzzer runs some inputs twice (again with leak tracking), so tally per file.
summary=$(awk '
  /^Running: /          { file = $2; seeds[file] = 1 }
  /^gguf-fuzz: parsed:/ { parsed[file] = 1 }
  /tokenizer: built/    { built[file] = 1 }
  END {
    for (file in seeds) {
      if (!(file in parsed)) print "  not parsed: " file
      else if (file ~ /\/tokenizer_[^\/]*$/ && !(file in built)) print "  no tokenizer: " file
    }
  }' "$work/replay.log")
seed_count=$(find "$work/seeds" -type f | wc -l)
replayed=$(grep -c '^Running: ' "$work/replay.log")
built=$(find "$work/seeds" -name 'tokenizer_*' -type f | wc -l)  # each checked above
if [[ -n $summary ]] || ((replayed != seed_count)); then
  echo "FAIL: the seeds no longer do their job ($replayed of $seed_count replayed):"
  echo "$summary"
  grep '^gguf-fuzz:' "$work/replay.log" | grep -v 'tokenizer: built' | sort -u | head -n 20
  exit 1
fi

corpus=$work/corpus
mkdir -p "$corpus"
cp "$work/seeds"/* "$corpus/"
log=$work/fuzz.log
# -timeout: one input running 10 s is a hang; the outer timeout guards the whole run.
(cd "$work" && timeout -k 10 $((seconds + 90)) "$binary" -max_total_time="$seconds" \
  -max_len=65536 -timeout=10 -rss_limit_mb=2048 -dict="$here/gguf.dict" \
  -artifact_prefix="$artifacts/gguf-" "$corpus") >"$log" 2>&1
rc=$?
stats=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
if ((rc == 0)) && grep -q '^Done [0-9]* runs' "$log"; then
  echo "ok: gguf ($seed_count seeds replayed, $built tokenizers built; $(grep '^Done [0-9]* runs' "$log" | tail -n 1); ${stats:-no stats})"
  exit 0
fi
echo "FAIL: gguf (exit status $rc); log tail:"
grep -v '^INFO: \|^#[0-9]\|^[[:space:]]*NEW_FUNC\|^Dictionary: ' "$log" | tail -n 60
for input in "$artifacts"/gguf-*; do
  [[ -f $input ]] || continue
  echo "  input: $input ($(stat -c %s "$input") bytes), base64:"
  base64 -w 100 "$input" | head -n 200 | sed 's/^/    /'
done
exit 1
