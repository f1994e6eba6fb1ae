#!/usr/bin/env bash
# Build FlexKV's compiled extension (flexkv.c_ext) from source for one interpreter, without a GPU,
# and print the folder to put on PYTHONPATH (it holds flexkv/ with the built c_ext) as the last line.
#
#   bash scripts/install_flexkv.sh                      # for .venv-sglang (torch 2.14.1+cu130)
#   PYTHON=/path/to/python FLEXKV_SOURCE_TREE=/path/to/FlexKV bash scripts/install_flexkv.sh
#
# Source: FLEXKV_SOURCE_TREE, else ../shared/flexkv-34ab141-src (read-only: built in a copy, nothing is
# written into it, nothing is installed into PYTHON's site-packages). The build is cached outside the
# clone (FLEXKV_BUILD_CACHE, default ~/.cache/flexkv-adapter/flexkv-build), keyed by a hash of the
# tree's content, this script (its edits and flags) and PYTHON's torch and Python versions; each build
# goes into a temporary folder published by an atomic rename under a lock, so clones never race and a
# second run compiles nothing. The result is copied to .flexkv-build/ here (git-ignored).
# Exit status: 0 built (or cached), 3 the source tree is incomplete (nothing built), 1 a failure.
# Facts (flags, compiler wheels, times): ../shared/reference/flexkv_build.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_install_lib.sh
REPO=$PWD
PYTHON=${PYTHON:-.venv-sglang/bin/python}
SRC=${FLEXKV_SOURCE_TREE:-../shared/flexkv-34ab141-src}
CACHE=${FLEXKV_BUILD_CACHE:-$HOME/.cache/flexkv-adapter/flexkv-build}
OUT=$REPO/.flexkv-build
FLAGS=(FLEXKV_ENABLE_CPUTEST=1 FLEXKV_ENABLE_METRICS=0 FLEXKV_DEBUG=1 TORCH_CUDA_ARCH_LIST=9.0 "MAX_JOBS=${MAX_JOBS:-2}")

fail() { say "install_flexkv: $1 FAILED: $2"; exit 1; }
# pip_target DIR PACKAGES...: packages into DIR alone (no dependencies, PYTHON's environment untouched)
pip_target() {
    local dir=$1
    shift
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --target "$dir" "$@" 2>&1 |
        { grep -v "is ignored" || true; }
    return "${PIPESTATUS[0]}"
}

# The edits to FlexKV's build files, all of them, each with its reason (applied to the copy only).
edit_setup_py() {
    local setup=$1
    # 1. With CPUTEST it overwrites TORCH_CUDA_ARCH_LIST with 7.0..9.0; CUDA 13's nvcc has no compute_70.
    sed -i 's/    os.environ\["TORCH_CUDA_ARCH_LIST"\] = "7.0;7.5;8.0;8.6;9.0"/    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "7.0;7.5;8.0;8.6;9.0")/' "$setup"
    grep -q 'os.environ.setdefault("TORCH_CUDA_ARCH_LIST"' "$setup" || return 1
    # 2. torch 2.14's headers require C++20 ("#error C++20 or later compatible compiler is required").
    sed -i 's/    "-std=c++17",/    "-std=c++20",/' "$setup"
    grep -q '"-std=c++20",' "$setup" || return 1
}

[ -x "$PYTHON" ] || fail "finding the interpreter" "$PYTHON does not exist (run scripts/install_sglang_cpu.sh, or set PYTHON)"
[ -f "$SRC/setup.py" ] && [ -d "$SRC/csrc" ] || fail "finding the source" "$SRC is not a FlexKV source tree (set FLEXKV_SOURCE_TREE)"
[ -d "$SRC/third_party/spdlog/include" ] && [ -f "$SRC/third_party/xxHash/xxhash.c" ] ||
    fail "finding the source" "$SRC lacks its submodules third_party/spdlog and third_party/xxHash"
# Files the build needs that a copy made through .gitignore-style rules loses ("dist/", "cache/"): a tree
# without them is incomplete (exit 3: the caller may go on with the stand-ins and say why), not a failure.
NEEDED=(csrc/dist/lease_meta_mempool.h flexkv/cache/cache_engine.py flexkv/cache/radixtree.py)
missing=()
for f in "${NEEDED[@]}"; do [ -f "$SRC/$f" ] || missing+=("$f"); done
if [ "${#missing[@]}" != 0 ]; then
    say "install_flexkv: the source tree $SRC is incomplete: it lacks ${missing[*]} (FlexKV's csrc/dist/ and" \
        "flexkv/cache/ are part of commit 34ab141); point FLEXKV_SOURCE_TREE at a complete FlexKV checkout"
    exit 3
fi
SRC=$(cd "$SRC" && pwd)
PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON") # absolute, the venv's link kept
if [ -z "${FLEXKV_GIT_COMMIT:-}" ]; then
    if [ "$SRC" = "$(cd "$REPO/../shared/flexkv-34ab141-src" 2>/dev/null && pwd)" ]; then
        FLEXKV_GIT_COMMIT=34ab141e87763536de27d5aa3b80ae720abaf279 # the shared tree has no .git
    elif ! FLEXKV_GIT_COMMIT=$(git -C "$SRC" rev-parse HEAD 2>/dev/null) ||
        [ "$(git -C "$SRC" rev-parse --show-toplevel)" != "$SRC" ]; then
        fail "naming the commit" "$SRC is not the top of a git checkout; set FLEXKV_GIT_COMMIT to its FlexKV commit"
    fi
fi
export FLEXKV_GIT_COMMIT
VERSIONS=$("$PYTHON" -c 'import sys, torch; print(f"python {sys.version.split()[0]} torch {torch.__version__}")') ||
    fail "reading PYTHON's torch" "$PYTHON cannot import torch"
KEY=$( {
    (cd "$SRC" && find . -type f ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
    sha256sum "$0"
    echo "$VERSIONS ${FLAGS[*]} $FLEXKV_GIT_COMMIT"
} | sha256sum | cut -c1-16)
ENTRY=$CACHE/$KEY
mkdir -p "$CACHE"

publish() {
    rm -rf "$OUT.tmp"
    cp -a "$ENTRY" "$OUT.tmp"
    rm -rf "$OUT"
    mv "$OUT.tmp" "$OUT"
}

check() { # the built module loads under PYTHON and names the commit; BUILD_INFO says so in one line
    (cd / && PYTHONPATH=$1 "$PYTHON" -c "
import torch, flexkv.c_ext as c
assert c.__file__.endswith('.so'), c.__file__
assert c.__git_commit__ == '${FLEXKV_GIT_COMMIT:0:12}', c.__git_commit__
print(f'flexkv.c_ext {c.__git_commit__} compiled for torch {torch.__version__}')") >"$1/BUILD_INFO" &&
        cat "$1/BUILD_INFO"
}

if [ -d "$ENTRY" ]; then
    say "install_flexkv: cached build $KEY ($VERSIONS): nothing to compile"
    publish
    check "$OUT" >&2 || fail "loading the cached build" "$ENTRY does not load; remove it and run again"
    echo "$OUT"
    exit 0
fi

# A CUDA compiler: an installed toolkit, else NVIDIA's registry wheels matching torch's CUDA 13.
CUDA=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA/bin/nvcc" ] || [ ! -e "$CUDA/lib64/libcudart.so" ]; then
    CUDA=$CACHE/cuda-13.0
    if [ ! -x "$CUDA/bin/nvcc" ]; then
        need_disk 1024 "NVIDIA's CUDA 13.0 compiler wheels"
        step "NVIDIA's CUDA 13.0 compiler wheels into $CUDA.wheels" "~210 MB" "1-2 minutes" \
            pip_target "$CUDA.wheels" \
            nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85 \
            nvidia-cuda-runtime==13.0.96
        NV=$CUDA.wheels/nvidia/cu13
        mkdir -p "$CUDA/lib64"
        for d in bin include nvvm; do ln -sfn "$NV/$d" "$CUDA/$d"; done
        ln -sf "$NV/lib/libcudart.so.13" "$CUDA/lib64/libcudart.so"
    fi
fi
# torch's own CUDA library headers (cusparse.h, cublas*.h: ATen's CUDA headers include them) from its wheels
NVINC=$("$PYTHON" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "include"))' 2>/dev/null) ||
    fail "finding torch's CUDA headers" "PYTHON's torch has no nvidia/cu13 wheels (a CUDA 13 build of torch is needed)"
[ -f "$NVINC/cusparse.h" ] || fail "finding torch's CUDA headers" "$NVINC has no cusparse.h"
# liburing: the system's, else Debian's liburing-dev unpacked here (its static liburing.a: no run-time
# dependency, nothing installed on the system).
HEADERS=("CPATH=$NVINC")
if [ ! -f /usr/include/liburing.h ]; then
    U=$CACHE/liburing
    if [ ! -f "$U/lib/liburing.a" ]; then
        step "Debian's liburing-dev into $U" "~1 MB" "seconds" bash -c "
            set -e; rm -rf '$U.tmp'; mkdir -p '$U.tmp/deb' && cd '$U.tmp/deb' && apt-get download -q liburing-dev >/dev/null
            dpkg -x liburing-dev_*.deb '$U.tmp/root'; mkdir -p '$U.tmp/lib'
            cp -L '$U.tmp'/root/usr/lib/*/liburing.a '$U.tmp/lib/'; mv '$U.tmp/root/usr/include' '$U.tmp/include'
            rm -rf '$U'; mv '$U.tmp' '$U'"
    fi
    HEADERS=("CPATH=$NVINC:$U/include" "LIBRARY_PATH=$U/lib")
fi
# ninja for parallel compiles, beside the build (not in PYTHON's site-packages)
TOOLS=$CACHE/tools
if [ ! -x "$TOOLS/bin/ninja" ]; then
    step "ninja into $TOOLS" "~0.5 MB" "seconds" \
        "$PYTHON" -m pip install -q --disable-pip-version-check --target "$TOOLS" ninja==1.13.0
fi

exec 9>"$CACHE/lock"
say "install_flexkv: waiting for the build lock $CACHE/lock ..."
flock 9
if [ ! -d "$ENTRY" ]; then
    need_disk 2048 "FlexKV's build"
    TMP=$(mktemp -d "$CACHE/build.XXXXXX")
    trap 'rm -rf "$TMP"' EXIT
    say "install_flexkv: copying $SRC to $TMP/src ($(du -sh "$SRC" | cut -f1))"
    cp -r "$SRC" "$TMP/src"
    chmod -R u+w "$TMP/src"
    edit_setup_py "$TMP/src/setup.py" || fail "editing setup.py" "an edit no longer applies to this FlexKV (see edit_setup_py)"
    T0=$SECONDS
    say "install_flexkv: cmake (libxxhash, headers; ~20 s) ..."
    (mkdir -p "$TMP/src/build" && cd "$TMP/src/build" && cmake .. -DFLEXKV_ENABLE_MONITORING=OFF >"$TMP/cmake.log" 2>&1 &&
        cmake --build . >>"$TMP/cmake.log" 2>&1) || { tail -30 "$TMP/cmake.log" >&2; fail "cmake" "see the log above"; }
    say "install_flexkv: compiling c_ext (11 units, ~5 min on 2 cores, up to ~12 when busy; 3.6 GB per unit) ..."
    (cd "$TMP/src" && env "${FLAGS[@]}" "${HEADERS[@]}" CUDA_HOME="$CUDA" PATH="$TOOLS/bin:$CUDA/bin:$PATH" \
        PYTHONPATH="$TOOLS" "$PYTHON" setup.py build_ext --inplace >"$TMP/build.log" 2>&1) ||
        { cp "$TMP/build.log" "$CACHE/failed-build.log"; { grep -E "error|Error" "$TMP/build.log" || tail -5 "$TMP/build.log"; } | tail -20 >&2
          fail "compiling c_ext" "the lines above; whole log: $CACHE/failed-build.log"; }
    say "install_flexkv: compiled in $((SECONDS - T0)) s"
    mkdir -p "$TMP/out"
    cp -r "$TMP/src/flexkv" "$TMP/out/flexkv"
    find "$TMP/out" -name __pycache__ -prune -exec rm -rf {} +
    rm -rf "$TMP/out/flexkv/lib"
    cp -L "$TMP"/src/build/lib/libxxhash.so* "$TMP/out/flexkv/" # c_ext's rpath holds $ORIGIN
    strip --strip-debug "$TMP/out/flexkv/c_ext.so"
    check "$TMP/out" >&2 || fail "loading the build" "the compiled module does not load under $PYTHON"
    mv "$TMP/out" "$ENTRY"
    say "install_flexkv: cached as $ENTRY ($(du -sh "$ENTRY" | cut -f1))"
fi
flock -u 9
publish
echo "$OUT"
