#!/usr/bin/env bash
# Several "hosts" on one machine, for trying a run across machines: network namespaces
# PREFIX-1 .. PREFIX-N with the private addresses 10.77.0.1/24 .. 10.77.0.N/24 on their eth0,
# joined by a bridge that lives in a namespace of its own (PREFIX-br), so nothing is added to the
# machine's own network and deleting the namespaces removes every interface. Needs root.
#
#   scripts/netns_hosts.sh up PREFIX N       make them (exit 1 with ip's message on failure;
#                                            run `down` then to remove what was made)
#   scripts/netns_hosts.sh down PREFIX N     delete them (those that exist; never fails)
#   scripts/netns_hosts.sh cut PREFIX I      cut host I off the network: its cable is pulled
#                                            (the bridge's end of its link goes down), so what
#                                            it sends is dropped silently, as in a partition
#   scripts/netns_hosts.sh mend PREFIX I     plug host I back in
#
# Run a command on host i with `ip netns exec PREFIX-i COMMAND`; processes still running in a
# namespace keep it alive after `down`, so stop them first.
set -euo pipefail

usage() {
    echo "usage: $0 up|down PREFIX N | cut|mend PREFIX I" >&2
    exit 2
}

[[ $# -eq 3 ]] || usage
action=$1 prefix=$2 num_hosts=$3  # cut and mend: the host's number
[[ $num_hosts =~ ^[1-9][0-9]*$ && $num_hosts -le 254 ]] || usage
bridge_ns="$prefix-br"

up() {
    ip netns add "$bridge_ns"
    ip -n "$bridge_ns" link add br0 type bridge
    ip -n "$bridge_ns" link set br0 up
    for i in $(seq 1 "$num_hosts"); do
        local ns="$prefix-$i"
        ip netns add "$ns"
        ip -n "$bridge_ns" link add "veth$i" type veth peer name eth0 netns "$ns"
        ip -n "$bridge_ns" link set "veth$i" master br0 up
        ip -n "$ns" addr add "10.77.0.$i/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
    done
}

down() {
    local existing
    existing=$(ip netns list 2>/dev/null | awk '{print $1}')
    for ns in "$bridge_ns" $(seq -f "$prefix-%g" 1 "$num_hosts"); do
        if grep -qxF "$ns" <<<"$existing"; then
            ip netns del "$ns" || echo "could not delete namespace $ns" >&2
        fi
    done
}

# The bridge's end of host I's link: down, the host's eth0 loses its carrier and every packet
# between the host and the others is dropped; no error reaches the processes on either side.
set_link() {
    ip -n "$bridge_ns" link set "veth$num_hosts" "$1"
}

case $action in
up) up ;;
down) down ;;
cut) set_link down ;;
mend) set_link up ;;
*) usage ;;
esac
