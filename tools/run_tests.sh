#!/usr/bin/env bash
# run_tests.sh — runs every test suite of an already built tree and prints one
# closing line, "N passed, N failed, N skipped", summed over all suites.
#
#   tools/run_tests.sh [BUILD_DIR...]     default: build build-asan
#
# Suites: ctest in each build dir (unit tests and fuzz drivers), then pytest
# over tests/integration when it holds test files, then the server, CLI and
# REPL tests again with a sanitizer build's binary. Counts come from JUnit XML
# that ctest and pytest write, not from scraping their text. Exits non-zero
# if any suite failed or could not run. Every suite runs even after a failure,
# so one report shows everything that is broken.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

BUILDS=("$@")
[ "${#BUILDS[@]}" -gt 0 ] || BUILDS=(build build-asan)
JOBS=${LUAINFER_TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
RESULTS=$(mktemp -d)
trap 'rm -rf "$RESULTS"' EXIT

total_pass=0 total_fail=0 total_skip=0 suites_failed=()

# junit_counts FILE -> "passed failed skipped" (ctest and pytest both write
# <testsuite tests= failures= errors= skipped= disabled=>, maybe inside <testsuites>)
junit_counts() {
    "$PY" - "$1" <<'EOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
t = f = s = 0
for su in suites:
    g = lambda k: int(su.get(k, 0) or 0)
    t += g("tests"); f += g("failures") + g("errors"); s += g("skipped") + g("disabled")
print(t - f - s, f, s)
EOF
}

# record NAME RC [XML]: adds a suite's counts; a failing suite with no
# readable counts still counts as one failure
record() {
    local name=$1 rc=$2 xml=${3:-} p=0 f=0 s=0
    if [ -n "$xml" ] && [ -s "$xml" ] && read -r p f s < <(junit_counts "$xml" 2>/dev/null); then :; else
        p=0 f=0 s=0
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    [ "$rc" -ne 0 ] && suites_failed+=("$name")
    total_pass=$((total_pass + p)) total_fail=$((total_fail + f)) total_skip=$((total_skip + s))
    printf '== %s: %d passed, %d failed, %d skipped (exit %d)\n' "$name" "$p" "$f" "$s" "$rc"
}

# ---- ctest in each build --------------------------------------------------
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
for b in "${BUILDS[@]}"; do
    if [ ! -f "$b/CTestTestfile.cmake" ]; then
        printf '== ctest %s: not built\n' "$b"
        record "ctest $b" 1
        continue
    fi
    printf '\n== ctest %s\n' "$b"
    xml=$RESULTS/ctest-${b//\//_}.xml
    # the sanitizer build skips tests labelled slow (real-model engine runs
    # that take minutes under ASan); tests/lua/test_smoke.lua covers the
    # engine there
    extra=()
    case "$b" in *asan*) extra=(-LE slow) ;; esac
    ctest --test-dir "$b" --output-on-failure -j "$JOBS" --output-junit "$xml" "${extra[@]}"
    record "ctest $b" $? "$xml"
done

# ---- pytest ---------------------------------------------------------------
# Many integration tests wait on a server or a child process more than they
# compute: two pytest-xdist workers (LUAINFER_TEST_JOBS of them) overlap
# that. Each file stays on one worker, so its module fixtures are built
# once. (The two files that bind the README's fixed addresses, test_readme
# and test_serve_defaults, skip a command, saying so, if the other holds
# the address at that moment.)
XDIST=()
if [ "$JOBS" -gt 1 ] && "$PY" -c 'import xdist' 2>/dev/null; then
    XDIST=(-n "$JOBS" --dist loadfile)
fi
if compgen -G 'tests/integration/test_*.py' >/dev/null || compgen -G 'tests/integration/*_test.py' >/dev/null; then
    printf '\n== pytest tests/integration\n'
    xml=$RESULTS/pytest.xml
    LUAINFER_BIN=$PWD/build/luainfer LUAINFER_SOURCE_DIR=$PWD \
        "$PY" -m pytest tests/integration -q -rs "${XDIST[@]}" --junitxml="$xml"
    rc=$?
    # exit 5 = no tests collected: a failure here, since test files exist
    record "pytest" "$rc" "$xml"
    # the readers of outside bytes once more with the sanitizer build's
    # binary: the server (sockets, HTTP, msgpack-RPC, clients that vanish),
    # the CLI's error paths, the REPL and the hostile policies, end to end
    # (a few minutes)
    for b in "${BUILDS[@]}"; do
        case "$b" in *asan*) ;; *) continue ;; esac
        [ -x "$b/luainfer" ] || continue
        printf '\n== pytest with %s/luainfer (ASan/UBSan)\n' "$b"
        xml=$RESULTS/pytest-${b//\//_}.xml
        LUAINFER_BIN=$PWD/$b/luainfer LUAINFER_SOURCE_DIR=$PWD \
            "$PY" -m pytest tests/integration/test_server.py tests/integration/test_cli_errors.py \
            tests/integration/test_repl_interrupt.py tests/integration/test_policy_hostile.py -q -rs "${XDIST[@]}" \
            --junitxml="$xml"
        record "pytest $b" $? "$xml"
    done
else
    printf '\n== pytest: no test files in tests/integration\n'
fi

echo
if [ "${#suites_failed[@]}" -gt 0 ]; then
    printf 'failed suites: %s\n' "${suites_failed[*]}"
fi
if [ "$total_skip" -gt 0 ]; then
    printf '%d passed, %d failed, %d skipped\n' "$total_pass" "$total_fail" "$total_skip"
else
    printf '%d passed, %d failed\n' "$total_pass" "$total_fail"
fi
[ "${#suites_failed[@]}" -eq 0 ] && [ "$total_fail" -eq 0 ]
