#!/bin/sh
# Set up allocdiag on a Debian machine and run it, or run its test suite.
#
#   sh tools/bootstrap.sh run [ALLOCDIAG ARGS]   install, then run allocdiag ARGS
#   sh tools/bootstrap.sh test [PYTEST ARGS]     install with the test extra, run the tests
#
# As root on Debian it first installs the system packages listed in
# tools/packages.txt (the one list: "run" ones for the tool and its demo, all
# of them for the tests), only those missing.  Then a virtualenv in .venv with
# the package installed from this checkout.  Before the tests it checks that
# every listed package is installed and that the repository's C/C++ sources
# use headers from listed packages only (tests/deps.py).  Safe to run again.
set -eu
cd "$(dirname "$0")/.."
mode="${1:-run}"
[ $# -gt 0 ] && shift

# tools/packages.txt: "PACKAGE run|test PROVIDES..." lines, # comments.
purpose=run
[ "$mode" = test ] && purpose=test
need_pkgs=$(awk -v p="$purpose" '{ sub(/#.*/, "") } NF >= 2 && (p == "test" || $2 == "run") { print $1 }' tools/packages.txt)
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
    # A green run must not depend on packages installed by hand: every
    # listed package present, no build input from an unlisted one.
    "$PY" tests/deps.py check test
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
