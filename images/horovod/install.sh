#!/bin/sh
# Install Horovod 0.28.1 (PyTorch + Gloo, no MPI) into a Python environment, building it once.
#
#   images/horovod/install.sh [PYTHON]
#
# PYTHON is the interpreter whose environment receives Horovod (default: `python` on PATH, which
# in a fleetrun setup step is the job's activated venv). It must already have torch.
#
# Why a script of our own: the newest Horovod release (0.28.1) does not build against recent
# torch. Its CMake files ask for C++14 while PyTorch's headers need C++17 ("#error C++17 or later
# compatible compiler is required"). Raising the standard to 17 in the two CMake files is enough.
#
# Why a cache: the build takes minutes (about 3.5 on 2 cores). The wheel it produces is kept,
# keyed by Python ABI and torch version (the extension links against torch), so a re-run,
# another venv or another job on the same machine installs it in seconds:
#   - $FLEETRUN_WHEEL_DIR when set;
#   - else /opt/fleetrun/wheels when writable (root: the test machine, a machine image);
#   - else ${XDG_CACHE_HOME:-$HOME/.cache}/fleetrun/wheels (a node user).
# The key also names the collectives (cpu, or HOROVOD_GPU_OPERATIONS such as nccl); the wheel is
# built for this machine's CPU (Horovod's default -mavx -mfma), so it is not meant to travel to
# older CPUs. /opt/fleetrun/wheels is always searched, so a wheel baked into a machine image is found by
# every user. Concurrent runs on one machine are serialised with flock when it is available.
#
# Idempotent: when the environment already imports horovod.torch 0.28.1 built with Gloo (the
# local fleet's image has it, and the job venvs layer the image in), it prints so and exits 0.
set -eu

HOROVOD_VERSION=0.28.1
PY=${1:-python}
SHARED_WHEELS=/opt/fleetrun/wheels

say() { echo "horovod-install: $*"; }
die() { echo "horovod-install: error: $*" >&2; exit 1; }

command -v "$PY" >/dev/null 2>&1 || [ -x "$PY" ] || die "no interpreter $PY"

# CPU collectives over Gloo unless HOROVOD_GPU_OPERATIONS (e.g. NCCL) asks for more: part of the
# cache key, so a CPU-only wheel is never reused where GPU collectives were asked for.
OPS=$(echo "${HOROVOD_GPU_OPERATIONS:-cpu}" | tr '[:upper:]' '[:lower:]')

installed() {
    FLEETRUN_HVD_OPS=$OPS "$PY" - <<'EOF' 2>/dev/null
import os, sys
import horovod, horovod.torch as hvd
ok = horovod.__version__ == "0.28.1" and hvd.gloo_built()
ok = ok and (os.environ["FLEETRUN_HVD_OPS"] != "nccl" or hvd.nccl_built())
sys.exit(0 if ok else 1)
EOF
}

if installed; then
    say "horovod $HOROVOD_VERSION (torch, gloo) already importable by $PY"
    exit 0
fi

TAG=$("$PY" -c 'import sys, torch; print("cp%d%d-torch%s" % (sys.version_info[0], sys.version_info[1], torch.__version__))') \
    || die "$PY cannot import torch; install torch first (Horovod's extension is built against it)"
TAG="$TAG-$OPS"

if [ -n "${FLEETRUN_WHEEL_DIR:-}" ]; then
    WHEELS=$FLEETRUN_WHEEL_DIR
elif mkdir -p "$SHARED_WHEELS" 2>/dev/null && [ -w "$SHARED_WHEELS" ]; then
    WHEELS=$SHARED_WHEELS
else
    WHEELS=${XDG_CACHE_HOME:-$HOME/.cache}/fleetrun/wheels
fi
CACHE="$WHEELS/horovod-$HOROVOD_VERSION/$TAG"
mkdir -p "$CACHE"

find_wheel() {
    for dir in "$CACHE" "$SHARED_WHEELS/horovod-$HOROVOD_VERSION/$TAG"; do
        for whl in "$dir"/horovod-"$HOROVOD_VERSION"-*.whl; do
            [ -f "$whl" ] && { echo "$whl"; return 0; }
        done
    done
    return 1
}

build() {
    command -v cmake >/dev/null 2>&1 || "$PY" -m pip install -q --disable-pip-version-check "cmake>=3.13" \
        || die "cmake is missing and could not be installed with pip"
    command -v g++ >/dev/null 2>&1 || die "g++ is missing (Debian/Ubuntu: apt-get install g++ make)"
    "$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        || die "Python headers are missing for $PY (Debian/Ubuntu: apt-get install python3-dev)"
    START=$(date +%s)
    say "building horovod $HOROVOD_VERSION for $TAG (minutes, once; cached in $CACHE)"
    "$PY" -m pip install -q --disable-pip-version-check setuptools wheel cloudpickle psutil pyyaml packaging
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
    SDIST="$WHEELS/horovod-$HOROVOD_VERSION.tar.gz"
    if [ ! -f "$SDIST" ]; then
        "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
            "horovod==$HOROVOD_VERSION" -d "$WORK/sdist"
        cp "$WORK"/sdist/horovod-"$HOROVOD_VERSION".tar.gz "$SDIST.tmp" && mv "$SDIST.tmp" "$SDIST"
    fi
    tar -xzf "$SDIST" -C "$WORK"
    SRC="$WORK/horovod-$HOROVOD_VERSION"
    # The patch: C++17 instead of C++14, in the two CMake files that set it.
    for f in "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"; do
        sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$f"
        grep -q 'set(CMAKE_CXX_STANDARD 17)' "$f" || die "patch did not apply to $f"
        ! grep -q 'set(CMAKE_CXX_STANDARD 14)' "$f" || die "patch left C++14 in $f"
    done
    LOG="$CACHE/build.log"
    if ! (
        cd "$SRC"
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
            HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
            MAKEFLAGS="-j$(nproc 2>/dev/null || echo 2)" \
            "$PY" -m pip wheel -v --disable-pip-version-check --no-deps --no-build-isolation \
            -w "$WORK/dist" .
    ) >"$LOG" 2>&1; then
        tail -n 40 "$LOG" >&2
        die "building horovod failed; full log: $LOG"
    fi
    say "built in $(($(date +%s) - START)) s; log: $LOG"
    for whl in "$WORK"/dist/horovod-*.whl; do
        cp "$whl" "$CACHE/$(basename "$whl").tmp"
        mv "$CACHE/$(basename "$whl").tmp" "$CACHE/$(basename "$whl")"
    done
    rm -rf "$WORK"
    trap - EXIT
}

install_cached() {
    if ! find_wheel >/dev/null; then
        build
    fi
    WHEEL=$(find_wheel) || die "no wheel in $CACHE after building"
    say "installing $WHEEL"
    "$PY" -m pip install -q --disable-pip-version-check "$WHEEL"
}

if command -v flock >/dev/null 2>&1; then
    # One build per machine at a time; the second waits, then installs the first one's wheel.
    exec 9>"$CACHE/.lock"
    flock 9
fi
if installed; then
    say "horovod $HOROVOD_VERSION already importable by $PY (installed while waiting)"
    exit 0
fi
install_cached
installed || die "horovod was installed but 'import horovod.torch' (with gloo) fails in $PY"
say "horovod $HOROVOD_VERSION ready in $PY"
