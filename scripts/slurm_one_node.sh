#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for testing `apexrl slurm` for real.
#
#   scripts/slurm_one_node.sh install        apt-get install munge and slurm (Debian/Ubuntu, root)
#   scripts/slurm_one_node.sh up DIR [CPUS]  start munged, slurmctld and slurmd with every file
#                                            (keys, config, state, logs, sockets) under DIR
#   scripts/slurm_one_node.sh down DIR       stop them, cancel what is left and delete nothing
#                                            but their pid files
#   scripts/slurm_one_node.sh env DIR        print `export SLURM_CONF=...` for the client commands
#
# Nothing outside DIR is written: the client commands (sbatch, squeue, scancel) find the cluster
# through SLURM_CONF=DIR/slurm.conf. The node is this host, reached at 127.0.0.1, and declares
# CPUS cores (default 16; more than a small machine has, so that a test's roles each get one:
# SlurmdParameters=config_overrides). Processes are tracked by their parents (proctrack/linuxproc),
# which needs no cgroups. Must run as root: the daemons run as root and the jobs run as the user
# who submits them.
set -euo pipefail

die() {
    echo "slurm_one_node.sh: $*" >&2
    exit 1
}

CTLD_PORT=${APEXRL_SLURMCTLD_PORT:-16817}
SLURMD_PORT=${APEXRL_SLURMD_PORT:-16818}

install_packages() {
    [ "$(id -u)" = 0 ] || die "installing packages needs root"
    command -v apt-get >/dev/null || die "no apt-get on this machine: install munge and slurm yourself"
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null; then
        return 0
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
}

write_config() {
    local dir=$1 cpus=$2 node
    node=$(hostname -s)
    local memory_mb
    memory_mb=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
    cat >"$dir/slurm.conf" <<EOF
# A one-node test cluster written by scripts/slurm_one_node.sh.
ClusterName=apexrl-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=10
MinJobAge=30
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
}

up() {
    local dir=$1 cpus=${2:-16}
    [ "$(id -u)" = 0 ] || die "the daemons of a test cluster need root"
    for command in munged slurmctld slurmd sbatch; do
        command -v "$command" >/dev/null || die "$command is not installed (run: $0 install)"
    done
    mkdir -p "$dir"/{munge,state,spool,log}
    dir=$(cd "$dir" && pwd)
    chmod 0700 "$dir/munge"
    if [ ! -s "$dir/munge/munge.key" ]; then
        head -c 1024 /dev/urandom >"$dir/munge/munge.key"
        chmod 0400 "$dir/munge/munge.key"
    fi
    write_config "$dir" "$cpus"
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
        --seed-file="$dir/munge/munged.seed" ||
        die "munged did not start: $(tail -3 "$dir/log/munged.log" 2>/dev/null)"
    export SLURM_CONF=$dir/slurm.conf
    slurmctld -f "$dir/slurm.conf" || die "slurmctld did not start: $(tail -3 "$dir/log/slurmctld.log")"
    slurmd -f "$dir/slurm.conf" || die "slurmd did not start: $(tail -3 "$dir/log/slurmd.log")"
    local state=""
    for _ in $(seq 1 60); do
        state=$(sinfo -h -N -o '%T' 2>/dev/null | head -1 || true)
        case "$state" in
            idle | mixed | allocated) echo "one-node cluster up in $dir (node $(hostname -s), $state)"; return 0 ;;
        esac
        sleep 0.5
    done
    die "the node did not come up (state '${state:-none}'); logs in $dir/log"
}

stop_pid_file() {
    local pid_file=$1 name=$2
    [ -s "$pid_file" ] || return 0
    local pid
    pid=$(cat "$pid_file")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "slurm_one_node.sh: $name ($pid) ignored SIGTERM; killing it" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$pid_file"
}

down() {
    local dir=$1
    [ -d "$dir" ] || return 0
    dir=$(cd "$dir" && pwd)
    if [ -f "$dir/slurm.conf" ] && [ -s "$dir/slurmctld.pid" ]; then
        SLURM_CONF=$dir/slurm.conf scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    fi
    stop_pid_file "$dir/slurmd.pid" slurmd
    stop_pid_file "$dir/slurmctld.pid" slurmctld
    # Step daemons of jobs that were still ending when slurmd stopped.
    pkill -TERM -f "slurmstepd.*$dir" 2>/dev/null || true
    stop_pid_file "$dir/munge/munged.pid" munged
}

case "${1:-}" in
    install) install_packages ;;
    up) [ $# -ge 2 ] || die "usage: $0 up DIR [CPUS]"; up "$2" "${3:-16}" ;;
    down) [ $# -ge 2 ] || die "usage: $0 down DIR"; down "$2" ;;
    env) [ $# -ge 2 ] || die "usage: $0 env DIR"; echo "export SLURM_CONF=$(cd "$2" && pwd)/slurm.conf" ;;
    *) die "usage: $0 install | up DIR [CPUS] | down DIR | env DIR" ;;
esac
