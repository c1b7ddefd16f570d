#!/bin/bash
# One tally reduction server on this node: the server step of
# config/slurm/tally-train.sbatch. The batch script reads this file and srun
# hands its text to bash on every server node, so those nodes need tally and
# its configuration, not this file. By hand, on a node, with the CPUs the
# step would get:
#
#   TALLY_CONFIG=/etc/tally/server.toml taskset -c 1-63 config/slurm/tally-server-step.sh
#
# 1. The EFA variables, decided on this node (tally efa-env).
# 2. The CPUs this step may run on (its affinity mask: with --cpu-bind=none,
#    every CPU Slurm allocated on the node; with CpuSpecList=0 in slurm.conf
#    that is 1-63 on a c7gn.16xlarge). The first runs the control plane
#    (bootstrap, job admission, heartbeats, /metrics): tally pins only its
#    lcores, and its other threads run on the one CPU no lcore keeps busy.
#    The rest are the lcores: 2-63, config/c7gn.16xlarge.toml's plan.
# 3. The configuration with those lcores, written to
#    $TMPDIR/tally-server-<job>-<node>.toml (kept: it is what ran), so that
#    doctor checks what the server will run: lcores inside the mask,
#    hugepages for that many slabs.
# 4. tally doctor: a failed check ends the step here, its report in the job's
#    output, before the server takes any hugepage.
# 5. The open-files limit raised to its hard limit, then exec tally server:
#    the server itself gets the step's signals (SIGTERM from scancel or the
#    job's end drains it).
#
# Environment: TALLY (the binary, default /usr/local/bin/tally), TALLY_CONFIG
# (default /etc/tally/server.toml), TALLY_PORT (default 7400), TALLY_TOKEN
# (read by the server).
set -euo pipefail

TALLY="${TALLY:-/usr/local/bin/tally}"
TALLY_CONFIG="${TALLY_CONFIG:-/etc/tally/server.toml}"
TALLY_PORT="${TALLY_PORT:-7400}"
node="${SLURMD_NODENAME:-$HOSTNAME}"

fail() {
    echo "tally server step on $node: $*" >&2
    exit 1
}

# "1-63" -> "2-63": a kernel CPU list (ascending) without its first CPU.
without_first_cpu() {
    first="${1%%,*}"
    rest="${1#"$first"}"
    rest="${rest#,}"
    case "$first" in
        *-*)
            lo="${first%-*}"
            hi="${first#*-}"
            if [ $((lo + 1)) -lt "$hi" ]; then first="$((lo + 1))-$hi"; else first="$hi"; fi
            echo "$first${rest:+,$rest}"
            ;;
        *) echo "$rest" ;;
    esac
}

[[ -r "$TALLY_CONFIG" ]] || fail "no server configuration at $TALLY_CONFIG (TALLY_CONFIG)"

efa_env="$("$TALLY" efa-env print --role server --format sh)" || fail "tally efa-env failed"
eval "$efa_env"

granted="$(awk '/^Cpus_allowed_list:/ { print $2 }' /proc/self/status)"
lcores="$(without_first_cpu "$granted")"
[[ -n "$lcores" ]] || fail "Slurm gave this step CPU $granted only: it runs the control plane, none is left for lcores"
echo "tally server step on $node: CPUs $granted: control plane on ${granted%%[-,]*}, lcores $lcores" >&2

step_config="${TMPDIR:-/tmp}/tally-server-${SLURM_JOB_ID:-$$}-$node.toml"
{
    echo "# $TALLY_CONFIG with the lcores of Slurm step ${SLURM_JOB_ID:-?}.${SLURM_STEP_ID:-?} on $node"
    grep -v -E '^[[:space:]]*lcores[[:space:]]*=' "$TALLY_CONFIG"
    echo "lcores = \"$lcores\""
} >"$step_config"

if ! "$TALLY" doctor --config "$step_config" >&2; then
    fail "tally doctor found a failed check (its report above; configuration $step_config): not starting the server"
fi

# Every client connection is a descriptor: the soft limit up to the hard one
# (the server warns when it is below what its configuration admits).
ulimit -S -n "$(ulimit -H -n)"
exec "$TALLY" server --config "$step_config" --listen "0.0.0.0:$TALLY_PORT"
