#!/usr/bin/env bash
# tools/bootstrap.sh without installing anything: a package that cannot exist is reported with
# the one command that installs it (exit 1), in --check mode and, where this runs as root and
# can drop to the unprivileged user nobody, on the no-root-no-sudo path; a bad option is exit
# 2; and when nothing is missing it is silent and fast. Exit 77 (skipped) without dpkg-query.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bootstrap="$root/tools/bootstrap.sh"
fake=riftco-transformer-no-such-package
expected="    sudo apt-get update && sudo apt-get install -y --no-install-recommends"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "skipped: no dpkg-query (not a Debian/Ubuntu system)"
    exit 77
fi

# $1: what is checked; the rest: the command. It must exit 1 and print exactly one command
# line, "sudo apt-get update && sudo apt-get install ... <fake>", naming the fake package last.
expect_command() {
    local what=$1 output rc lines before=$failures
    shift
    output=$("$@" 2>&1)
    rc=$?
    [[ $rc -eq 1 ]] || fail "$what: exit $rc, expected 1; output: $output"
    lines=$(grep -c '^    sudo apt-get' <<< "$output")
    [[ $lines -eq 1 ]] || fail "$what: $lines command lines, expected 1; output: $output"
    grep -qxE "$expected( [a-z0-9.+-]+)* $fake" <<< "$output" ||
        fail "$what: no '$expected ... $fake' line; output: $output"
    ((failures > before)) || echo "ok: $what"
}

expect_command "--check names the missing package" bash "$bootstrap" --check "$fake"
expect_command "--check --tests names the missing package" bash "$bootstrap" --check --tests "$fake"

# The unprivileged path (no root, no sudo): it must print the command instead of installing.
# Only run when we are root and can become nobody, who cannot use sudo without a password.
if [[ $(id -u) -eq 0 ]] && command -v setpriv >/dev/null 2>&1 && id nobody >/dev/null 2>&1; then
    as_nobody=(setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups)
    if "${as_nobody[@]}" test -r "$bootstrap" &&
       ! "${as_nobody[@]}" sudo -n true >/dev/null 2>&1; then
        expect_command "as nobody, no sudo: prints the command" \
            env HOME=/ "${as_nobody[@]}" bash "$bootstrap" "$fake"
    else
        echo "not run: nobody cannot read $bootstrap (or may use sudo)"
    fi
elif [[ $(id -u) -ne 0 ]] && ! { command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; }; then
    expect_command "no root, no sudo: prints the command" bash "$bootstrap" "$fake"
else
    echo "not run: the unprivileged path (needs root with setpriv, or a user without sudo)"
fi

output=$(bash "$bootstrap" --no-such-option 2>&1)
rc=$?
if [[ $rc -eq 2 ]]; then
    echo "ok: an unknown option is exit 2"
else
    fail "unknown option: exit $rc, expected 2; output: $output"
fi

# Nothing missing: silent and fast. The packages the build needs are normally installed where
# this runs; when they are not (built with libraries from elsewhere), this check is not run.
if bash "$bootstrap" --check >/dev/null 2>&1; then
    start=$(date +%s%N)
    output=$(bash "$bootstrap" 2>&1)
    rc=$?
    elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
    if [[ $rc -ne 0 || -n "$output" ]]; then
        fail "nothing missing: exit $rc, output '$output'"
    elif ((elapsed_ms >= 1000)); then
        fail "nothing missing: took $elapsed_ms ms"
    else
        echo "ok: nothing missing is silent ($elapsed_ms ms)"
    fi
else
    echo "not run: the silent path (some build packages are not installed here)"
fi

((failures == 0))
