#!/bin/bash
# instr_builds.sh OLD_BIN NEW_BIN — two builds' instruction counts inside
# li_engine_step (callgrind, one thread), for the shapes bench_cpu.lua
# times: a 128-token prefill and decode of 1, 8 and 32 sequences. Counts
# do not depend on the machine's load, unlike bench/bench_builds.py's
# wall-clock ratios. Valgrind masks AVX-512 in CPUID, so the AVX2 kernels
# run. Prints "shape old new new/old".
set -eu
[ $# -eq 2 ] || { echo "usage: $0 OLD_BIN NEW_BIN" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "instr_builds: valgrind not found (apt-get install valgrind)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
count() { # BIN ARGS... -> instructions collected inside li_engine_step
    local bin=$1; shift
    (cd "$out" && CG_THREADS=1 valgrind --tool=callgrind --collect-atstart=no --toggle-collect=li_engine_step \
        --callgrind-out-file="$out/cg.out" "$bin" run "$here/instr_step.lua" "$@" >"$out/log" 2>&1) ||
        { echo "instr_builds: $bin run failed:" >&2; tail -5 "$out/log" >&2; exit 1; }
    grep -o 'Collected : [0-9]*' "$out/log" | grep -o '[0-9]*$'
}
for shape in "prefill 128" "decode 1 16" "decode 8 16" "decode 32 8"; do
    # shellcheck disable=SC2086
    o=$(count "$1" $shape); n=$(count "$2" $shape)
    printf '%-12s %14s %14s %.4f\n' "$(echo $shape | tr ' ' _)" "$o" "$n" "$(awk -v n="$n" -v o="$o" 'BEGIN { print n / o }')"
done
