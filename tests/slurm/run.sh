#!/usr/bin/env bash
# config/slurm/ under a real Slurm (Debian's slurmctld, slurmd and munge):
# a cluster of six nodes emulated on this host, and config/slurm/tally-train.sbatch
# submitted to it unchanged, from the checkout as its header says. Run as root:
#
#   make test-slurm                      (or: tests/slurm/run.sh)
#   TALLY=target/release/tally tests/slurm/run.sh
#
# The cluster: one network namespace per node (tally-cpu1-2, partition cpu;
# tally-gpu1-4, partition gpu), each with its own hostname (a UTS namespace)
# and a veth link to a bridge in the controller's namespace (tally-ctl,
# 198.18.0.0/24, a benchmarking range no real network routes), one slurmd
# each and slurmctld in the controller's. The node names resolve in every
# namespace through a hosts file of the run, bind-mounted over /etc/hosts in
# each daemon's own mount namespace: the host's /etc/hosts is not touched.
# One munged, in the host's namespace, with a key made for the run (its
# socket is a file, which every namespace reaches). What a container without
# systemd lacks, the configuration does without: processes tracked by parent
# (proctrack/linuxproc), no task binding (task/none), no accounting; the
# nodes' CPUs, memory and 8 GPUs each are declared
# (SlurmdParameters=config_overrides; gres.conf with AutoDetect=off and
# stand-in device files), so that the sbatch's --ntasks-per-node=8
# --gpus-per-node=8 --exclusive is granted as written. slurmd 22.05 still
# wants the host's cgroup mounts under /sys/fs/cgroup (it refuses to start
# without them, whatever the plugins): a container that has none cannot run
# this.
#
# The job: the sbatch and config/slurm/tally-server-step.sh as they are; what
# a user sets in the environment of sbatch (its --export=ALL passes it on)
# points them at this host: TALLY (this build), TALLY_CONFIG (config/local.toml
# made for tcp between namespaces), TALLY_FABRIC=tcp, and TRAIN_CMD. There is
# no GPU and no NCCL here, so the training command is tally's own agg client,
# one rank per Slurm task (`tally bench allreduce --launched`: rank and size
# from the RANK and WORLD_SIZE the sbatch exports, rank 0 at MASTER_ADDR),
# every element of every all-reduce checked. The only option given to sbatch
# is --chdir, so that its output file lands in the run's folder instead of the
# checkout.
#
# Checked: the job COMPLETED with exit code 0; both servers started on their
# nodes (each step's configuration file, the ready lines), `tally doctor` ran
# and passed on each; every rank (32: 4 nodes x 8) finished on its node with
# 0 wrong elements; the servers served (completions, no errors), drained and
# stopped when the training step ended, and no process of the job is left on
# any node. Then everything made is removed (daemons, namespaces and what
# runs in them) on any exit; the run's folder is kept on failure.
#
# Builds nothing. Environment (all optional):
#   TALLY       the tally binary (default: make test's ci build, else target/ci, else target/release)
#   SIZES ITERS WARMUP   the ranks' all-reduces (default 64K,1M, 20 and 2 per size)
#   WAIT_S      the longest the job may take, queued and running (default 600)
#   KEEP        1: keep the run's folder (logs, slurm.conf, the job's output) on success too
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SIZES=${SIZES:-64K,1M}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-2}
WAIT_S=${WAIT_S:-600}
KEEP=${KEEP:-0}
PKGS=(slurmctld slurmd slurm-client munge iproute2 util-linux procps)
# The nodes: the sbatch asks for 2 in partition cpu and 4 in partition gpu.
CPU_NODES=(tally-cpu1 tally-cpu2)
GPU_NODES=(tally-gpu1 tally-gpu2 tally-gpu3 tally-gpu4)
NODES=("${CPU_NODES[@]}" "${GPU_NODES[@]}")
CTL=tally-ctl
NET=198.18.0
RANKS_PER_NODE=8
NS_PREFIX=tally-slurm-

die() {
    echo "slurm: FAILED: $*" >&2
    exit 1
}

[ "$(id -u)" -eq 0 ] || die "run as root (network namespaces, Slurm's daemons)"

default_tally() {
    for f in "$root/target/$(uname -m)-unknown-linux-gnu/ci/tally" "$root/target/ci/tally" "$root/target/release/tally"; do
        if [ -x "$f" ]; then
            echo "$f"
            return
        fi
    done
    echo missing
}
TALLY=${TALLY:-$(default_tally)}
[ -x "$TALLY" ] || die "no tally binary at $TALLY: build one (make build, or cargo build --profile ci -p tally-cli) or set TALLY"
TALLY=$(readlink -f "$TALLY")

# ---- packages (as scripts/build/deps.sh installs the build's) -----------------
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "not an apt-based system: install the equivalents of ${missing[*]}"
    echo "slurm: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # policy-rc.d or not, the packages' own services are not what runs here.
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
PATH="$PATH:/usr/sbin:/sbin"
for tool in slurmctld slurmd sbatch scontrol sinfo squeue scancel munged ip nsenter unshare flock mknod; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found after installing ${PKGS[*]}"
done

# One run at a time: the node and namespace names are fixed.
lock_dir=/run/lock
[ -d "$lock_dir" ] && [ -w "$lock_dir" ] || lock_dir=/tmp
exec 9>"$lock_dir/tally-slurm-test.lock"
flock -n 9 || die "another tests/slurm/run.sh is running (lock held)"

W=$(mktemp -d /tmp/tally-slurm.XXXXXX)
chmod 755 "$W"
mkdir -p "$W"/{etc,log,run,ctld,spool,tmp,munge}
pids=()
ok=0

ns_of() { echo "$NS_PREFIX${1#tally-}"; }
# A command in node namespace $1's network, /etc/hosts and hostname. Not `ip
# netns exec`: it mounts a new /sys, without the host's cgroup mounts, and
# slurmd 22.05 refuses to start without them (whatever the plugins:
# "No filesystem mounted on /sys/fs/cgroup").
in_ns() {
    local ns=$1
    local name=${ns#"$NS_PREFIX"}
    shift
    # shellcheck disable=SC2016 # the inner shell expands its own arguments
    nsenter --net="/run/netns/$ns" unshare --mount --uts --propagation private \
        sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' in-ns "$W/etc/hosts" "tally-$name" "$@"
}
ALL_NS=("$(ns_of "$CTL")")
for n in "${NODES[@]}"; do ALL_NS+=("$(ns_of "$n")"); done

# Removes what a run made: daemons (ours, by pid), namespaces (their
# processes first). Also what a killed run left.
teardown() {
    local p ns
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    if [ -s "$W/munge/pid" ]; then kill -TERM "$(cat "$W/munge/pid")" 2>/dev/null || true; fi
    sleep 1
    for ns in "${ALL_NS[@]}"; do
        if ip netns list | grep -qw "$ns"; then
            for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
            ip netns del "$ns" 2>/dev/null || true
        fi
    done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
on_exit() {
    local rc=$?
    teardown
    if [ "$ok" = 1 ] && [ "$KEEP" != 1 ]; then
        rm -rf "$W"
    else
        echo "slurm: the run's folder (logs, configuration, the job's output) is kept: $W" >&2
    fi
    exit "$rc"
}
teardown
trap on_exit EXIT
trap 'exit 130' INT TERM

# ---- network: a bridge in the controller's namespace, a veth to each node ----
ctl_ns=$(ns_of "$CTL")
host_lines="$NET.1 $CTL"
ip netns add "$ctl_ns"
ip -n "$ctl_ns" link set lo up
ip -n "$ctl_ns" link add br0 type bridge
ip -n "$ctl_ns" addr add "$NET.1/24" dev br0
ip -n "$ctl_ns" link set br0 up
i=10
for n in "${NODES[@]}"; do
    i=$((i + 1))
    ns=$(ns_of "$n")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ctl_ns" link add "v-$n" type veth peer name eth0 netns "$ns"
    ip -n "$ctl_ns" link set "v-$n" master br0 up
    ip -n "$ns" addr add "$NET.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    host_lines+=$'\n'"$NET.$i $n"
    echo "$NET.$i" >"$W/run/$n.addr"
done
printf '127.0.0.1 localhost\n%s\n' "$host_lines" >"$W/etc/hosts"

# ---- munge: one key for the run ---------------------------------------------
chmod 711 "$W/munge"
dd if=/dev/urandom of="$W/munge/key" bs=1024 count=1 status=none
chmod 400 "$W/munge/key"
# --force: root's own daemon, in a folder under /tmp.
munged --force --key-file="$W/munge/key" --socket="$W/munge/socket" --pid-file="$W/munge/pid" \
    --seed-file="$W/munge/seed" --log-file="$W/log/munged.log" ||
    die "munged did not start ($W/log/munged.log)"

# ---- Slurm's configuration ----------------------------------------------------
node_line() { echo "NodeName=$1 NodeAddr=$(cat "$W/run/$1.addr") CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=4096 $2"; }
{
    cat <<EOF
# Made by tests/slurm/run.sh for one run; see its header.
ClusterName=tally-test
SlurmctldHost=$CTL($NET.1)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$W/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$W/ctld
SlurmdSpoolDir=$W/spool/%n
SlurmctldPidFile=$W/run/slurmctld.pid
SlurmdPidFile=$W/run/slurmd-%n.pid
SlurmctldLogFile=$W/log/slurmctld.log
SlurmdLogFile=$W/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# Heterogeneous jobs are started by the backfill scheduler only: every second
# rather than every 30.
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
GresTypes=gpu
ReturnToService=2
KillWait=10
MinJobAge=600
EOF
    for n in "${CPU_NODES[@]}"; do node_line "$n" ""; done
    for n in "${GPU_NODES[@]}"; do node_line "$n" "Gres=gpu:8"; done
    echo "PartitionName=cpu Nodes=$(IFS=,; echo "${CPU_NODES[*]}") MaxTime=INFINITE State=UP"
    echo "PartitionName=gpu Nodes=$(IFS=,; echo "${GPU_NODES[*]}") MaxTime=INFINITE State=UP Default=YES"
} >"$W/etc/slurm.conf"
# No GPUs here: 8 declared per gpu node. Slurm 22.05 drops a GPU without a
# device file ("Removing file-less GPU"), so each has one that no process
# opens: a character device of /dev/null's numbers (a plain file where mknod
# is refused), in the run's folder.
mkdir -p "$W/dev"
for i in 0 1 2 3 4 5 6 7; do
    mknod "$W/dev/gpu$i" c 1 3 2>/dev/null || : >"$W/dev/gpu$i"
done
cat >"$W/etc/gres.conf" <<EOF
AutoDetect=off
NodeName=$(IFS=,; echo "${GPU_NODES[*]}") Name=gpu File=$W/dev/gpu[0-7]
EOF
export SLURM_CONF="$W/etc/slurm.conf"

# ---- the daemons, each in its node's namespaces --------------------------------
for n in "${NODES[@]}"; do mkdir -p "$W/spool/$n"; done
in_ns "$ctl_ns" slurmctld -D -c -f "$SLURM_CONF" >"$W/log/slurmctld.out" 2>&1 &
pids+=($!)
for n in "${NODES[@]}"; do
    in_ns "$(ns_of "$n")" slurmd -D -N "$n" -f "$SLURM_CONF" >"$W/log/slurmd-$n.out" 2>&1 &
    pids+=($!)
done
deadline=$((SECONDS + 60))
until [ "$(in_ns "$ctl_ns" sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" -eq ${#NODES[@]} ]; do
    for p in "${pids[@]}"; do
        kill -0 "$p" 2>/dev/null || die "a Slurm daemon exited: $(tail -n 5 "$W"/log/*.out "$W"/log/slurm*.log 2>/dev/null)"
    done
    ((SECONDS < deadline)) || die "the nodes are not idle after 60 s: $(in_ns "$ctl_ns" sinfo -N 2>&1)"
    sleep 1
done
echo "slurm: ${#NODES[@]} nodes up: $(in_ns "$ctl_ns" sinfo -h -o '%P %D %t %G' | tr '\n' ';')"

# ---- the servers' configuration: config/local.toml over tcp between nodes -----
# The step replaces lcores with its CPUs and listens on TALLY_PORT; 32 ranks
# need max_ranks 32; small slabs need no hugepage pool.
sed -E -e 's/^provider = .*/provider = "tcp"/' -e 's/^max_ranks = .*/max_ranks = 64/' \
    -e 's/^slab_size = .*/slab_size = "16M"/' -e 's/^hugepages = .*/hugepages = "prefer"/' \
    "$root/config/local.toml" >"$W/etc/server.toml"
if ! grep -q '^provider = "tcp"' "$W/etc/server.toml" || ! grep -q '^max_ranks = 64' "$W/etc/server.toml"; then
    die "config/local.toml changed shape: $W/etc/server.toml did not get provider and max_ranks"
fi

# ---- the job -----------------------------------------------------------------
train="$TALLY bench allreduce --launched --mode agg --sizes $SIZES --iters $ITERS --warmup $WARMUP --poll adaptive --timeout 120"
cd "$root"
job=$(in_ns "$ctl_ns" env TALLY="$TALLY" TALLY_CONFIG="$W/etc/server.toml" TALLY_FABRIC=tcp TALLY_LOG=info \
    TMPDIR="$W/tmp" TRAIN_CMD="$train" sbatch --parsable --chdir="$W" config/slurm/tally-train.sbatch) ||
    die "sbatch refused the job"
job=${job%%;*}
out="$W/tally-train-$job.out"
echo "slurm: job $job submitted (config/slurm/tally-train.sbatch, unchanged); waiting up to ${WAIT_S}s"
deadline=$((SECONDS + WAIT_S))
state=""
while :; do
    state=$(in_ns "$ctl_ns" scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | head -n1 | cut -d= -f2 || true)
    case "$state" in
        PENDING | CONFIGURING | RUNNING | COMPLETING | "") ;;
        *) break ;;
    esac
    if ((SECONDS >= deadline)); then
        in_ns "$ctl_ns" scancel "$job" || true
        die "job $job still $state after ${WAIT_S}s (output: $out)"
    fi
    sleep 2
done
job_info=$(in_ns "$ctl_ns" scontrol show job "$job")

# ---- checks ------------------------------------------------------------------
[ -r "$out" ] || die "job $job ($state) wrote no output file $out"
fails=()
fail() { fails+=("$*"); }
[ "$state" = COMPLETED ] || fail "job $job ended $state, not COMPLETED"
# A heterogeneous job shows one record per component: each exited 0.
codes=$(grep -o 'ExitCode=[0-9:]*' <<<"$job_info" | sort -u | tr '\n' ' ')
[ "$codes" = "ExitCode=0:0 " ] || fail "exit codes: $codes"
servers=$(printf '%s:7400,' "${CPU_NODES[@]}")
servers=${servers%,}
grep -qx "tally servers: $servers" "$out" || fail "the job's servers are not $servers"
for n in "${CPU_NODES[@]}"; do
    grep -q "^tally server step on $n: CPUs .*lcores" "$out" || fail "no server step started on $n"
    [ -r "$W/tmp/tally-server-$job-$n.toml" ] || fail "the server step on $n wrote no configuration ($W/tmp)"
done
count() { grep -c -- "$1" "$out" || true; }
[ "$(count 'tally doctor: checking against')" -eq 2 ] || fail "tally doctor did not run on both server nodes"
grep -q 'tally doctor found a failed check' "$out" && fail "tally doctor failed a check on a server node"
[ "$(grep -cE '^[0-9]+ passed, .*, 0 failed' "$out" || true)" -eq 2 ] || fail "not 2 doctor reports with 0 failed"
[ "$(count '^tally server ready on 0.0.0.0:7400')" -eq 2 ] || fail "not 2 servers ready on port 7400"
# Each server admitted the job of every rank and saw every rank finish.
ranks=$((${#GPU_NODES[@]} * RANKS_PER_NODE))
[ "$(grep -cE "job 0x[0-9a-f]+: $ranks ranks, .*: starting" "$out" || true)" -eq 2 ] || fail "not 2 servers admitted the job of $ranks ranks"
[ "$(count 'every rank finished; ending the job')" -eq 2 ] || fail "not 2 servers saw every rank finish"
[ "$(count 'signal: draining')" -eq 2 ] || fail "not 2 servers drained at the job's end"
[ "$(grep -c ' stopped$' "$out" || true)" -eq 2 ] || fail "not 2 servers stopped"
grep -E 'lcore [0-9]+: [0-9]+ completions' "$out" | grep -vq ', 0 errors$' && fail "a server's lcore had errors"
[ "$(grep -cE 'lcore [0-9]+: [1-9][0-9]* completions' "$out" || true)" -ge 2 ] || fail "the servers completed no work"
grep -qx 'training finished with status 0' "$out" || fail "the training step did not finish with status 0"
# The training step ends before the servers are told to drain.
trained=$(grep -n -m1 '^training finished' "$out" | cut -d: -f1 || true)
drained=$(grep -n -m1 'signal: draining' "$out" | cut -d: -f1 || true)
if [ -z "$trained" ] || [ -z "$drained" ] || [ "$drained" -le "$trained" ]; then
    fail "the servers did not drain after the training step finished"
fi
allreduces=""
silent=()
for ((r = 0; r < ranks; r++)); do
    node=${GPU_NODES[$((r / RANKS_PER_NODE))]}
    line=$(grep "^tally bench allreduce: rank $r of $ranks on " "$out" || true)
    if [ "$(grep -c . <<<"$line")" -ne 1 ]; then
        silent+=("$r")
        continue
    fi
    [[ "$line" == *" on $node: "* ]] || fail "rank $r ran elsewhere than $node: $line"
    [[ "$line" == *" through 2 servers, "*" 0 wrong (job: 0 wrong)" ]] || fail "rank $r: $line"
    a=$(sed -E 's/.*: ([0-9]+) all-reduces.*/\1/' <<<"$line")
    [ -z "$allreduces" ] || [ "$a" = "$allreduces" ] || fail "rank $r ran $a all-reduces, rank 0 $allreduces"
    allreduces=${allreduces:-$a}
done
[ ${#silent[@]} -eq 0 ] || fail "not one summary line from ${#silent[@]} ranks: ${silent[*]}"
[ "$(grep -c '^tally bench allreduce: rank ' "$out" || true)" -eq "$ranks" ] || fail "not $ranks rank summaries"
for n in "${NODES[@]}"; do
    left=$(ip netns pids "$(ns_of "$n")" | while read -r p; do
        c=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null || true)
        case "$c" in slurmd\ * | */slurmd\ *) ;; *) echo "$p $c" ;; esac
    done)
    [ -z "$left" ] || fail "processes left on $n after the job: $left"
done

if [ ${#fails[@]} -gt 0 ]; then
    echo "slurm: the job's output ($out), last lines:" >&2
    tail -n 40 "$out" >&2
    for f in "${fails[@]}"; do echo "slurm: $f" >&2; done
    die "${#fails[@]} checks failed for job $job"
fi
ok=1
echo "slurm: job $job COMPLETED: 2 servers (doctor passed), $ranks ranks x $allreduces all-reduces ($SIZES), 0 wrong, servers drained and stopped at the job's end"
