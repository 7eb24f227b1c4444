#!/bin/sh
# Set up allocdiag on a Debian machine and run it, or run its test suite.
#
#   sh tools/bootstrap.sh run [ALLOCDIAG ARGS]   install, then run allocdiag ARGS
#   sh tools/bootstrap.sh test [PYTEST ARGS]     install with the test extra, run the tests
#
# As root on Debian it first installs the system packages it needs (the
# allocators the tools and tests run targets under, a C compiler, tmux for the
# terminal test), only those missing.  Then a virtualenv in .venv with the
# package installed from this checkout.  Safe to run again.
set -eu
cd "$(dirname "$0")/.."
mode="${1:-run}"
[ $# -gt 0 ] && shift

RUN_PKGS="libjemalloc2 libjemalloc-dev libgoogle-perftools4 libmimalloc2.0 python3 python3-venv gcc libc6-dev binutils"
TEST_PKGS="$RUN_PKGS tmux gdb musl-tools"

need_pkgs=$RUN_PKGS
[ "$mode" = test ] && need_pkgs=$TEST_PKGS
if command -v dpkg-query >/dev/null 2>&1; then
    missing=""
    for p in $need_pkgs; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        if [ "$(id -u)" = 0 ]; then
            echo "bootstrap: installing Debian packages:$missing" >&2
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq >&2
            apt-get install -y -qq --no-install-recommends $missing >&2
        else
            echo "bootstrap: missing Debian packages:$missing (run as root to install them)" >&2
        fi
    fi
fi

# Prefer the system interpreter: tests drop privileges to check permission
# errors, and an interpreter under /root would be unreadable then.
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
extra=""
[ "$mode" = test ] && extra="[test]"
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >&2
.venv/bin/python -m pip install -q --disable-pip-version-check ".$extra" >&2

case "$mode" in
run)
    exec .venv/bin/allocdiag "$@"
    ;;
test)
    status=0
    .venv/bin/python -m pytest "$@" || status=$?
    if [ "$status" -eq 5 ]; then
        echo "bootstrap: pytest collected no tests: that is a failure here" >&2
        exit 1
    fi
    exit "$status"
    ;;
*)
    echo "usage: sh tools/bootstrap.sh run|test [ARGS]" >&2
    exit 2
    ;;
esac
