#!/usr/bin/env bash
# A SLURM cluster on this machine, for testing `apexrl slurm` for real. Needs root.
#
#   scripts/slurm_test_cluster.sh install          apt-get install munge and slurm (Debian, Ubuntu)
#   scripts/slurm_test_cluster.sh up DIR [NODES [CPUS]]
#                                                  start munged, slurmctld and one slurmd per node,
#                                                  every file (key, config, state, logs, sockets)
#                                                  under DIR; each node declares CPUS cores
#   scripts/slurm_test_cluster.sh exec DIR COMMAND...
#                                                  run a client command (sbatch, squeue, scancel,
#                                                  apexrl slurm) where the cluster is reachable
#   scripts/slurm_test_cluster.sh down DIR         stop the daemons, cancel what is left, delete
#                                                  the namespaces; keeps DIR's files
#
# One node (the default): the node is this host, reached at 127.0.0.1, and every daemon runs in
# the machine's own network. Several nodes: node i is a network namespace of its own with the
# address 10.77.0.i on a private bridge (scripts/netns_hosts.sh), and runs its own slurmd
# (`slurmd -N node<i>`); slurmctld runs in node 1's namespace, where `exec` runs client commands.
# Namespaces are entered with nsenter (network only), so the daemons still see the machine's
# /sys. Nothing outside DIR and the namespaces is written: the client commands find the cluster
# through SLURM_CONF=DIR/slurm.conf. CPUS defaults to 16, more than a small machine has, so that a
# test's roles each get one (SlurmdParameters=config_overrides). Processes are tracked by their
# parents (proctrack/linuxproc), which needs no cgroup setup.
set -euo pipefail

die() {
    echo "slurm_test_cluster.sh: $*" >&2
    exit 1
}

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CTLD_PORT=${APEXRL_SLURMCTLD_PORT:-16817}
SLURMD_PORT=${APEXRL_SLURMD_PORT:-16818}

install_packages() {
    [ "$(id -u)" = 0 ] || die "installing packages needs root"
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
        command -v munged >/dev/null && command -v sbatch >/dev/null; then
        return 0
    fi
    command -v apt-get >/dev/null || die "no apt-get on this machine: install munge and slurm yourself"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
}

# `in_node DIR I COMMAND...`: COMMAND in node I's network (the machine's own with one node).
in_node() {
    local dir=$1 node=$2
    shift 2
    if [ -s "$dir/netns_prefix" ]; then
        nsenter --net="/var/run/netns/$(cat "$dir/netns_prefix")-$node" "$@"
    else
        "$@"
    fi
}

write_config() {
    local dir=$1 nodes=$2 cpus=$3 memory_mb host
    host=$(hostname -s)
    memory_mb=$(awk -v n="$nodes" '/MemTotal/ {print int($2 / 1024 / 2 / n)}' /proc/meminfo)
    {
        echo "# A test cluster of $nodes node(s) written by scripts/slurm_test_cluster.sh."
        echo "ClusterName=apexrl-test"
        if [ "$nodes" = 1 ]; then
            echo "SlurmctldHost=$host(127.0.0.1)"
        else
            echo "SlurmctldHost=$host(10.77.0.1)"
        fi
        cat <<EOF
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
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
EOF
        if [ "$nodes" = 1 ]; then
            echo "NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN"
            echo "PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP"
        else
            for i in $(seq 1 "$nodes"); do
                echo "NodeName=node$i NodeAddr=10.77.0.$i CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN"
            done
            echo "PartitionName=debug Nodes=node[1-$nodes] Default=YES MaxTime=INFINITE State=UP"
        fi
    } >"$dir/slurm.conf"
}

up() {
    local dir=$1 nodes=$2 cpus=$3
    [ "$(id -u)" = 0 ] || die "the daemons of a test cluster need root"
    [[ $nodes =~ ^[1-9][0-9]?$ ]] || die "NODES must be 1..99, got '$nodes'"
    for command in munged slurmctld slurmd sbatch; do
        command -v "$command" >/dev/null || die "$command is not installed (run: $0 install)"
    done
    mkdir -p "$dir"/{munge,state,spool,log}
    dir=$(cd "$dir" && pwd)
    if [ "$nodes" -gt 1 ]; then
        command -v nsenter >/dev/null || die "several nodes need nsenter (util-linux)"
        local prefix="apxsl$$"
        echo "$prefix" >"$dir/netns_prefix"
        bash "$repo/scripts/netns_hosts.sh" up "$prefix" "$nodes" ||
            die "cannot make the nodes' network namespaces"
    fi
    echo "$nodes" >"$dir/nodes"
    chmod 0700 "$dir/munge"
    if [ ! -s "$dir/munge/munge.key" ]; then
        head -c 1024 /dev/urandom >"$dir/munge/munge.key"
        chmod 0400 "$dir/munge/munge.key"
    fi
    write_config "$dir" "$nodes" "$cpus"
    # munged listens on a Unix socket under DIR: the nodes' namespaces all reach it.
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
        --seed-file="$dir/munge/munged.seed" ||
        die "munged did not start: $(tail -n 3 "$dir/log/munged.log" 2>/dev/null)"
    export SLURM_CONF=$dir/slurm.conf
    in_node "$dir" 1 slurmctld -f "$SLURM_CONF" ||
        die "slurmctld did not start: $(tail -n 3 "$dir/log/slurmctld.log")"
    if [ "$nodes" = 1 ]; then
        mkdir -p "$dir/spool/$(hostname -s)"
        slurmd -f "$SLURM_CONF" || die "slurmd did not start: $(tail -n 3 "$dir"/log/slurmd-*.log)"
    else
        for i in $(seq 1 "$nodes"); do
            mkdir -p "$dir/spool/node$i"
            in_node "$dir" "$i" slurmd -f "$SLURM_CONF" -N "node$i" ||
                die "slurmd of node$i did not start: $(tail -n 3 "$dir/log/slurmd-node$i.log")"
        done
    fi
    local states=""
    for _ in $(seq 1 120); do
        states=$(in_node "$dir" 1 sinfo -h -N -o '%T' 2>/dev/null | sort | uniq -c | xargs || true)
        if [ "$(in_node "$dir" 1 sinfo -h -N -t idle -o '%N' 2>/dev/null | wc -l)" = "$nodes" ]; then
            echo "cluster of $nodes node(s) up in $dir ($states)"
            return 0
        fi
        sleep 0.5
    done
    die "the nodes did not come up (states: ${states:-none}); logs in $dir/log"
}

stop_pid_file() {
    local pid_file=$1 name=$2 pid
    [ -s "$pid_file" ] || return 0
    pid=$(cat "$pid_file")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "slurm_test_cluster.sh: $name ($pid) ignored SIGTERM; killing it" >&2
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
        SLURM_CONF=$dir/slurm.conf in_node "$dir" 1 scancel --full --quiet --user="$(id -un)" \
            2>/dev/null || true
    fi
    local pid_file
    for pid_file in "$dir"/slurmd-*.pid; do
        [ -e "$pid_file" ] && stop_pid_file "$pid_file" "slurmd"
    done
    stop_pid_file "$dir/slurmctld.pid" slurmctld
    # Step daemons of jobs that were still ending when their slurmd stopped.
    pkill -TERM -f "slurmstepd.*$dir" 2>/dev/null || true
    stop_pid_file "$dir/munge/munged.pid" munged
    if [ -s "$dir/netns_prefix" ]; then
        bash "$repo/scripts/netns_hosts.sh" down "$(cat "$dir/netns_prefix")" "$(cat "$dir/nodes")"
        rm -f "$dir/netns_prefix"
    fi
}

case "${1:-}" in
install) install_packages ;;
up)
    [ $# -ge 2 ] || die "usage: $0 up DIR [NODES [CPUS]]"
    up "$2" "${3:-1}" "${4:-16}"
    ;;
exec)
    [ $# -ge 3 ] || die "usage: $0 exec DIR COMMAND..."
    dir=$(cd "$2" && pwd)
    shift 2
    SLURM_CONF=$dir/slurm.conf in_node "$dir" 1 "$@"
    ;;
down)
    [ $# -ge 2 ] || die "usage: $0 down DIR"
    down "$2"
    ;;
*) die "usage: $0 install | up DIR [NODES [CPUS]] | exec DIR COMMAND... | down DIR" ;;
esac
