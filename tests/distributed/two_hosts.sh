#!/usr/bin/env bash
# Two "hosts": network namespaces joined by a veth pair, one rank in each, so the ranks' MPI
# traffic is real TCP over that link (shared memory is excluded) and mpirun starts the second
# rank's daemon through an rsh agent that enters the other namespace. Runs `mpi_ranks parity`
# across them: blocking, overlapped and ZeRO-1. Exit 77 (skipped, with the reason) without the privileges to make namespaces.
# Usage: two_hosts.sh <mpirun> <mpi_ranks>
set -euo pipefail
mpirun=$1
program=$2
suffix=$$
host_a="riftco_a_$suffix"
host_b="riftco_b_$suffix"
work=$(mktemp -d)
cleanup() {
    ip netns del "$host_a" 2>/dev/null || true
    ip netns del "$host_b" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
if ! command -v ip >/dev/null || ! ip netns add "$host_a" 2>"$work/error"; then
    echo "two_hosts: cannot create network namespaces ($(cat "$work/error" 2>/dev/null)); skipped"
    exit 77
fi
ip netns add "$host_b"
ip link add "va$suffix" type veth peer name "vb$suffix"
ip link set "va$suffix" netns "$host_a"
ip link set "vb$suffix" netns "$host_b"
ip -n "$host_a" addr add 10.77.0.1/24 dev "va$suffix"
ip -n "$host_b" addr add 10.77.0.2/24 dev "vb$suffix"
for host in "$host_a" "$host_b"; do
    ip -n "$host" link set lo up
done
ip -n "$host_a" link set "va$suffix" up
ip -n "$host_b" link set "vb$suffix" up

# mpirun calls the agent like ssh: [options] host command...
cat > "$work/agent" <<AGENT
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift;; *) break;; esac; done
host="\$1"; shift
case "\$host" in
  10.77.0.2) exec ip netns exec $host_b sh -c "\$*" ;;
  *) exec ip netns exec $host_a sh -c "\$*" ;;
esac
AGENT
chmod +x "$work/agent"

for variant in blocking overlapped zero; do
    timeout 120 ip netns exec "$host_a" "$mpirun" --mca plm_rsh_agent "$work/agent" \
        --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24 \
        --mca oob_tcp_if_include 10.77.0.0/24 --host 10.77.0.1,10.77.0.2 -n 2 \
        "$program" parity "$variant"
done
