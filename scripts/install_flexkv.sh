#!/usr/bin/env bash
# Build FlexKV's compiled extension (flexkv.c_ext) from source for one interpreter, without a GPU,
# and print the folder to put on PYTHONPATH (it holds flexkv/ with the built c_ext) as the last line.
#
#   bash scripts/install_flexkv.sh                      # for .venv-sglang (torch 2.14.1+cu130)
#   FLEXKV_PYTHON=/path/to/python FLEXKV_SOURCE_TREE=/path/to/FlexKV bash scripts/install_flexkv.sh
#
# Source: FLEXKV_SOURCE_TREE, else ../shared/flexkv-34ab141-src (read-only: built in a copy without its
# build/, .git and compiled files; nothing is written into it, nothing is installed into FLEXKV_PYTHON's
# site-packages). The build is cached outside the clone (FLEXKV_BUILD_CACHE, default
# ~/.cache/flexkv-adapter/flexkv-build), keyed by a hash of the tree's content, this script (its edits and
# flags) and the interpreter's torch and Python versions. Everything that writes to the cache or to
# .flexkv-build/ (git-ignored, in this clone) holds one lock, and each build is published by a rename, so
# clones and concurrent runs never race, and a second run compiles nothing.
# Exit status: 0 built (or cached), 3 the source tree is incomplete (nothing built), 1 a failure.
# Facts (flags, compiler wheels, times): ../shared/reference/flexkv_build.md.
set -euo pipefail
SCRIPT=$(cd "$(dirname "$0")" && pwd -P)/$(basename "$0")
cd "$(dirname "$0")/.."
. scripts/_install_lib.sh
REPO=$PWD
PY=${FLEXKV_PYTHON:-.venv-sglang/bin/python}
SRC=${FLEXKV_SOURCE_TREE:-../shared/flexkv-34ab141-src}
CACHE=${FLEXKV_BUILD_CACHE:-$HOME/.cache/flexkv-adapter/flexkv-build}
OUT=$REPO/.flexkv-build
FLAGS=(FLEXKV_ENABLE_CPUTEST=1 FLEXKV_ENABLE_METRICS=0 FLEXKV_DEBUG=1 TORCH_CUDA_ARCH_LIST=9.0)
SKIPPED=(./build ./.git) # never copied nor hashed: a checkout built in place or git activity changes nothing

fail() {
    say "install_flexkv: $1 FAILED: $2"
    exit 1
}
# tool_step WHAT SIZE TIME CMD...: step (scripts/_install_lib.sh), its failure always exit 1 (3 is reserved)
tool_step() { (step "$@") || fail "installing $1" "exit $?"; }
# pip_target DIR PACKAGES...: packages into DIR alone (no dependencies, the interpreter's environment untouched)
pip_target() {
    local dir=$1
    shift
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$dir" "$@" 2>&1 |
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

[ -x "$PY" ] || fail "finding the interpreter" "$PY does not exist (run scripts/install_sglang_cpu.sh, or set FLEXKV_PYTHON)"
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
SRC=$(cd "$SRC" && pwd -P)
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY") # absolute, the venv's link kept
if [ -z "${FLEXKV_GIT_COMMIT:-}" ]; then
    if [ "$SRC" = "$(cd "$REPO/../shared/flexkv-34ab141-src" 2>/dev/null && pwd -P)" ]; then
        FLEXKV_GIT_COMMIT=34ab141e87763536de27d5aa3b80ae720abaf279 # the shared tree has no .git
    elif ! FLEXKV_GIT_COMMIT=$(git -C "$SRC" rev-parse HEAD 2>/dev/null) ||
        [ "$(git -C "$SRC" rev-parse --show-toplevel)" != "$SRC" ]; then
        fail "naming the commit" "$SRC is not the top of a git checkout; set FLEXKV_GIT_COMMIT to its FlexKV commit"
    fi
fi
export FLEXKV_GIT_COMMIT
VERSIONS=$("$PY" -c 'import sys, torch; print(f"python {sys.version.split()[0]} torch {torch.__version__}")') ||
    fail "reading the interpreter's torch" "$PY cannot import torch"
PRUNE=()
for d in "${SKIPPED[@]}"; do PRUNE+=(-path "$d" -o); done
tree_files() { (cd "$SRC" && find . \( "${PRUNE[@]}" -name __pycache__ \) -prune -o -type f ! -name '*.so' -print0); }
KEY=$( {
    tree_files | LC_ALL=C sort -z | (cd "$SRC" && xargs -0 sha256sum)
    sha256sum "$SCRIPT"
    echo "$VERSIONS ${FLAGS[*]} $FLEXKV_GIT_COMMIT"
} | sha256sum | cut -c1-16)
ENTRY=$CACHE/$KEY
mkdir -p "$CACHE" || fail "making the cache folder" "cannot create $CACHE (set FLEXKV_BUILD_CACHE)"

check() { # the built module loads under the interpreter and names the commit; BUILD_INFO says so in one line
    (cd / && PYTHONPATH=$1 "$PY" -c "
import torch, flexkv.c_ext as c
assert c.__file__.endswith('.so'), c.__file__
assert c.__git_commit__ == '${FLEXKV_GIT_COMMIT:0:12}', c.__git_commit__
print(f'flexkv.c_ext {c.__git_commit__} compiled for torch {torch.__version__}')") >"$1/BUILD_INFO" &&
        cat "$1/BUILD_INFO"
}

publish() { # under the lock: the clone's copy replaced by a rename, never seen half-written
    rm -rf "$OUT.new" "$OUT.old"
    cp -a "$ENTRY" "$OUT.new" || fail "copying the build to $OUT" "$(free_mb "$REPO") MB free"
    [ ! -e "$OUT" ] || mv "$OUT" "$OUT.old"
    mv "$OUT.new" "$OUT"
    rm -rf "$OUT.old"
}

exec 9>"$CACHE/lock"
if ! flock -n 9; then
    say "install_flexkv: another build or publish holds $CACHE/lock; waiting (at most 30 minutes) ..."
    flock -w 1800 9 || fail "waiting for the build lock" "$CACHE/lock was held for 30 minutes"
fi
if [ -d "$ENTRY" ]; then
    say "install_flexkv: cached build $KEY ($VERSIONS): nothing to compile"
    publish
    check "$OUT" >&2 || fail "loading the cached build" "$ENTRY does not load under $PY (built for: $VERSIONS)"
    echo "$OUT"
    exit 0
fi

# A CUDA compiler: an installed toolkit, else NVIDIA's registry wheels matching torch's CUDA 13.
CUDA=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA/bin/nvcc" ] || [ ! -e "$CUDA/lib64/libcudart.so" ]; then
    CUDA=$CACHE/cuda-13.0
    if [ ! -x "$CUDA/bin/nvcc" ]; then
        need_disk 1024 "NVIDIA's CUDA 13.0 compiler wheels"
        tool_step "NVIDIA's CUDA 13.0 compiler wheels into $CUDA.wheels" "~210 MB" "1-2 minutes" \
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
NVINC=$("$PY" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "include"))' 2>/dev/null) ||
    fail "finding torch's CUDA headers" "the interpreter's torch has no nvidia/cu13 wheels (a CUDA 13 build of torch is needed)"
[ -f "$NVINC/cusparse.h" ] || fail "finding torch's CUDA headers" "$NVINC has no cusparse.h"
HEADERS=("CPATH=$NVINC")
# liburing: the system's, else Debian's liburing-dev unpacked here (its static liburing.a: no run-time
# dependency, nothing installed on the system).
if [ ! -f /usr/include/liburing.h ]; then
    U=$CACHE/liburing
    if [ ! -f "$U/lib/liburing.a" ]; then
        tool_step "Debian's liburing-dev into $U" "~1 MB" "seconds" bash -c "
            set -e; rm -rf '$U.tmp'; mkdir -p '$U.tmp/deb' && cd '$U.tmp/deb' && apt-get download -q liburing-dev >/dev/null
            dpkg -x liburing-dev_*.deb '$U.tmp/root'; mkdir -p '$U.tmp/lib'
            cp -L '$U.tmp'/root/usr/lib/*/liburing.a '$U.tmp/lib/'; mv '$U.tmp/root/usr/include' '$U.tmp/include'
            rm -rf '$U'; mv '$U.tmp' '$U'"
    fi
    HEADERS=("CPATH=$NVINC:$U/include" "LIBRARY_PATH=$U/lib")
fi
# ninja for parallel compiles, beside the build (not in the interpreter's site-packages)
TOOLS=$CACHE/tools
if [ ! -x "$TOOLS/bin/ninja" ]; then
    tool_step "ninja into $TOOLS" "~0.5 MB" "seconds" pip_target "$TOOLS" ninja==1.13.0
fi

need_disk 2048 "FlexKV's build"
TMP=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
keep_log() { cp "$TMP/$1" "$CACHE/failed-$1" 2>/dev/null || true; }
say "install_flexkv: copying $SRC to $TMP/src ($(du -sh "$SRC" | cut -f1), without ${SKIPPED[*]})"
mkdir -p "$TMP/src"
tree_files | (cd "$SRC" && tar --null -T - -cf -) | tar -C "$TMP/src" -xf - || fail "copying the source" "see above"
chmod -R u+w "$TMP/src"
edit_setup_py "$TMP/src/setup.py" || fail "editing setup.py" "an edit no longer applies to this FlexKV (see edit_setup_py)"
T0=$SECONDS
say "install_flexkv: cmake (libxxhash, headers; ~20 s) ..."
(mkdir -p "$TMP/src/build" && cd "$TMP/src/build" && cmake .. -DFLEXKV_ENABLE_MONITORING=OFF >"$TMP/cmake.log" 2>&1 &&
    cmake --build . >>"$TMP/cmake.log" 2>&1) ||
    { keep_log cmake.log; tail -30 "$TMP/cmake.log" >&2; fail "cmake" "the lines above; log: $CACHE/failed-cmake.log"; }
say "install_flexkv: compiling c_ext (11 units, ~5 min on 2 cores, up to ~12 when busy; 3.6 GB per unit) ..."
(cd "$TMP/src" && env "${FLAGS[@]}" "MAX_JOBS=${MAX_JOBS:-2}" "${HEADERS[@]}" CUDA_HOME="$CUDA" \
    PATH="$TOOLS/bin:$CUDA/bin:$PATH" PYTHONPATH="$TOOLS" "$PY" setup.py build_ext --inplace >"$TMP/build.log" 2>&1) ||
    {
        keep_log build.log
        { grep -E "error|Error" "$TMP/build.log" || tail -5 "$TMP/build.log"; } | tail -20 >&2
        fail "compiling c_ext" "the lines above; whole log: $CACHE/failed-build.log"
    }
say "install_flexkv: compiled in $((SECONDS - T0)) s"
package() {
    mkdir -p "$TMP/out" && cp -r "$TMP/src/flexkv" "$TMP/out/flexkv" &&
        find "$TMP/out" -name __pycache__ -prune -exec rm -rf {} + && rm -rf "$TMP/out/flexkv/lib" &&
        cp -L "$TMP"/src/build/lib/libxxhash.so* "$TMP/out/flexkv/" && # c_ext's rpath holds $ORIGIN
        strip --strip-debug "$TMP/out/flexkv/c_ext.so"
}
package || { keep_log build.log; fail "packaging the build" "$(free_mb "$CACHE") MB free; build log: $CACHE/failed-build.log"; }
check "$TMP/out" >&2 || fail "loading the build" "the compiled module does not load under $PY"
mv "$TMP/out" "$ENTRY"
say "install_flexkv: cached as $ENTRY ($(du -sh "$ENTRY" | cut -f1))"
publish
echo "$OUT"
