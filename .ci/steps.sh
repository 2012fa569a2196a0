# shellcheck shell=bash
# The step functions of .ci/run (sourced; tests/deploy/test_ci_steps.py drives them with stand-in
# steps): `step` runs a step in the foreground, `beside` starts one in the background and
# `joined` waits for it; every step prints its time, and the total comes last.

# `step NAME CMD...` runs CMD and prints (on stderr: a step may send its stdout away) how long
# it took; the total comes last, also when a step fails. Before it starts, a step beside that has
# already failed fails the run.
step() {
    local name=$1 start=$SECONDS
    shift
    beside_check
    "$@"
    echo "== $name: $((SECONDS - start))s" >&2
}

# `beside NAME CMD...` starts CMD (a program: not a function of this script) in the background,
# in a session of its own, its output in a log; `joined NAME` waits for it and prints how long it
# ran and how long the run waited on it, or, when it failed, its log, and fails the run. When the
# run ends early (a failure) every step beside still running gets a TERM (.ci/compose then tears
# its deployment down) and is waited for.
declare -A beside_pid=() beside_log=() beside_status=()
beside() {
    local name=$1
    shift
    beside_log[$name]="$(mktemp)"
    # the wrapper prints the step's time last in its log; on a TERM it waits for the step first
    setsid --wait bash -c '
        trap "exit 143" TERM
        start=$(date +%s)
        "$@"
        status=$?
        echo "== $0 (beside): $(($(date +%s) - start))s"
        exit ${status}' "${name}" "$@" >"${beside_log[$name]}" 2>&1 &
    beside_pid[$name]=$!
    echo "== $name: started beside" >&2
}
beside_failed() {  # beside_failed NAME STATUS: its log, and the run fails
    cat "${beside_log[$1]}" >&2
    echo "== $1 (beside): failed (exit status $2)" >&2
    exit "$2"
}
beside_check() {  # a step beside that has ended and failed fails the run now
    local name status
    for name in "${!beside_pid[@]}"; do
        if [[ -z "${beside_status[$name]:-}" ]] && ! kill -0 "${beside_pid[$name]}" 2>/dev/null; then
            status=0
            wait "${beside_pid[$name]}" || status=$?
            beside_status[$name]=${status}
            ((status == 0)) || beside_failed "${name}" "${status}"
        fi
    done
}
joined() {
    local name=$1 start=$SECONDS status
    if [[ -z "${beside_status[$name]:-}" ]]; then
        status=0
        wait "${beside_pid[$name]}" || status=$?
        beside_status[$name]=${status}
    fi
    status=${beside_status[$name]}
    ((status == 0)) || beside_failed "${name}" "${status}"
    echo "$(tail -1 "${beside_log[$name]}"), joined after a wait of $((SECONDS - start))s" >&2
}
finish() {
    local status=$? name
    trap - EXIT
    for name in "${!beside_pid[@]}"; do
        if [[ -z "${beside_status[$name]:-}" ]]; then  # an earlier step failed: stop it
            kill -TERM -- "-${beside_pid[$name]}" 2>/dev/null || kill -TERM "${beside_pid[$name]}"
            wait "${beside_pid[$name]}" 2>/dev/null || true
            echo "== $name (beside): stopped" >&2
        fi
    done
    echo "== total: ${SECONDS}s" >&2
    exit "${status}"
}
