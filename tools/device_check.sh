#!/usr/bin/env bash
# device_check.sh — everything a lent GPU machine should run, in one go
# (issue 20), writing one report file.
#
#   tools/device_check.sh [REPORT]     (default: $OUT/device_report.txt if $OUT
#                                       is set, else build-cuda/device_report.txt)
#
# 1. the machine: nvidia-smi, nvcc, NCCL;
# 2. a CUDA build (build-cuda/, LI_CUDA=ON, Release);
# 3. every CUDA test: today only the NCCL communicator's
#    (tests/unit/test_comm_nccl.c: one rank per device; it calls the device
#    probe of kernels/cuda/probe.cu). There is no CUDA backend yet, so there
#    are no CUDA op tests, no GPU greedy/perplexity checks and no GPU
#    benchmarks to run; the report says so rather than pretend;
# 4. the CPU tensor-parallel tests on the same build (test_comm, test_tp),
#    so the report shows the sharded pass the GPU ranks will run.
# Each stage has a time limit; the whole script stays within 8 minutes on
# a 16-core machine. Exit status: 0 when every stage that ran passed.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BUILD="$ROOT/build-cuda"
REPORT="${1:-${OUT:+$OUT/device_report.txt}}"
REPORT="${REPORT:-$BUILD/device_report.txt}"
mkdir -p "$(dirname "$REPORT")" "$BUILD"
: > "$REPORT"
status=0
JOBS="$(nproc 2>/dev/null || echo 2)"

say() { echo "$*" | tee -a "$REPORT"; }
stage() { say ""; say "== $* =="; }
# run NAME LIMIT_S CMD...: the command's output into the report, its verdict in a line
run() {
    local name="$1" limit="$2"
    shift 2
    local t0=$SECONDS
    timeout "$limit" bash -c '"$@"' _ "$@" >> "$REPORT" 2>&1 # bash -c: runs the exported `logged` too
    local rc=$?
    local verdict=PASS
    if [ $rc -eq 77 ]; then verdict=SKIP; elif [ $rc -eq 124 ]; then verdict="TIMEOUT (${limit}s)"; status=1;
    elif [ $rc -ne 0 ]; then verdict="FAIL (exit $rc)"; status=1; fi
    say "-- $name: $verdict in $((SECONDS - t0)) s"
    return $rc
}

say "luainfer device check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

stage "machine"
if command -v nvidia-smi > /dev/null; then
    run "nvidia-smi" 30 nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
else
    say "no nvidia-smi on PATH"
    status=1
fi
run "nvcc" 30 nvcc --version || true
ls /usr/local/cuda/lib64/libnccl* /usr/lib/x86_64-linux-gnu/libnccl* 2>/dev/null | tee -a "$REPORT" > /dev/null

stage "CUDA build ($BUILD)"
# the tools' output goes to logs beside the build; the report keeps what says what was found, or the failure
logged() {
    local log="$1"
    shift
    "$@" > "$log" 2>&1
    local rc=$?
    grep -E "luainfer:|NCCL|CUDA compiler identification" "$log"
    [ $rc -ne 0 ] && tail -40 "$log"
    return $rc
}
export -f logged
run "configure" 120 logged "$BUILD/configure.log" cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLI_CUDA=ON || status=1
if ! grep -q "LI_HAVE_CUDA" "$BUILD/compile_commands.json" 2>/dev/null; then
    say "the build did not enable CUDA (no nvcc found?): nothing GPU-side can run"
    status=1
fi
run "build" 300 logged "$BUILD/build.log" cmake --build "$BUILD" -j "$JOBS" || status=1

stage "CUDA tests"
say "CUDA op tests: none yet (no CUDA backend in kernels/cuda/; issue 20)"
run "unit/test_comm_nccl" 120 "$BUILD/test_comm_nccl"
if [ $? -eq 77 ] && command -v nvidia-smi > /dev/null; then
    say "   a skip on a machine with nvidia-smi: the build or the driver does not see the GPU"
    status=1
fi

stage "CPU tensor parallel (the sharded pass the GPU ranks will run)"
run "unit/test_comm" 60 "$BUILD/test_comm"
run "unit/test_tp" 180 "$BUILD/test_tp"

stage "benchmarks"
say "GPU benchmarks: none yet (they need the CUDA backend)"

stage "verdict"
if [ $status -eq 0 ]; then say "device check: every stage that ran passed"; else say "device check: FAILED (see above)"; fi
exit $status
