# Sourced by the guest scripts (check.sh, shim.sh, programs.sh; busybox sh):
# builds two "hosts" A and B in one guest and defines the helpers they share.
# scripts/softroce-vm copies this directory to /guest.d in the guest.
#
# Why the topology looks the way it does (measured on Debian's 6.1 kernel):
# rdma_rxe there works in the initial network namespace only. It routes its
# packets with ip_route_output_key(&init_net, oif = its netdev) and listens
# on UDP 4791 in init_net. An rxe device on a veth end moved into a
# namespace cannot send: dmesg (dynamic debug) says "rxeA: qp#17
# rxe_find_route4: no route to 10.9.0.2" / "prepare4: Host not reachable",
# every QP goes to error with IBV_WC_LOC_QP_OP_ERR, ib_write_lat hangs, and
# hw_counters/sent_pkts stays 0. Exclusive rdma netns mode does not help
# (`rdma dev set rxeX netns X`: Operation not supported for rxe), nor do
# VRFs (rxe finds its device from skb->dev, which the VRF rewrites to the
# VRF master: packets arrive, rcvd_pkts stays 0). So:
# - the RDMA wire is a veth pair vethA (10.9.0.1) <-> vethB (10.9.0.2) in
#   the root namespace, rxeA on vethA and rxeB on vethB. Both addresses are
#   local there, yet rxe's packets cross the wire: rxe routes with its own
#   netdev as the flow's output interface, and the FIB lookup skips routes
#   whose nexthop is another device, so the local route to the other end
#   (on the other veth) does not match and the connected route out of the
#   device's own veth does (`ip route get 10.9.0.2 from 10.9.0.1 oif
#   vethA` says dev vethA). accept_local=1 lets each end take packets (ARP
#   included) whose source address is local: without it the peer's ARP
#   request is dropped as a martian, ib_core cannot resolve the peer's MAC
#   and ibv_modify_qp to RTR fails;
# - the programs run in namespaces A and B. rdma is in shared netns mode
#   (the default), so both devices are visible in both; RINGSOCK_DEVICE
#   and -d pick rxeA in A and rxeB in B;
# - their TCP (verbscheck's control connection, the kernel TCP comparison,
#   perftest's exchange, the ctl daemons' port 7471, the shim's TCP
#   sockets) goes over a second veth pair ctlA (10.8.0.1, in A) <-> ctlB
#   (10.8.0.2, in B): a host's management network next to its RDMA NIC.
#   Bytes a program moves over TCP show on ctlA/ctlB, bytes moved over
#   RDMA on vethA/vethB: the counters tell which wire carried a stream.
# rsocket resolves addresses with rdma_cm in the caller's namespace, where
# no rxe netdev lives, so it cannot run A<->B on this kernel; its numbers
# come from the root namespace, both ends on rxeA (rxe loopback).
#
# There is no fallback: any setup step failing exits 3.

# busybox sh runs its own applets before PATH: call iproute2 by path.
IP=/usr/sbin/ip; [ -x $IP ] || IP=/sbin/ip
RDMA=/usr/bin/rdma; [ -x $RDMA ] || RDMA=/usr/sbin/rdma

step() { echo; echo "=== $* [t=$(cut -d' ' -f1 /proc/uptime)]"; }
must() { "$@" || { echo "SETUP FAILED: $*"; exit 3; }; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }

step "two hosts: namespaces A and B, RDMA wire vethA<->vethB, control wire ctlA<->ctlB"
must $IP netns add A
must $IP netns add B
must $IP link add ctlA type veth peer name ctlB
must $IP link set ctlA netns A
must $IP link set ctlB netns B
must $IP -n A addr add 10.8.0.1/24 dev ctlA
must $IP -n B addr add 10.8.0.2/24 dev ctlB
for n in A B; do must $IP -n $n link set lo up; must $IP -n $n link set ctl$n up; done
must $IP link add vethA type veth peer name vethB
must $IP addr add 10.9.0.1/24 dev vethA
must $IP addr add 10.9.0.2/24 dev vethB
must $IP link set vethA up
must $IP link set vethB up
for d in all vethA vethB; do
  must sysctl -q -w net.ipv4.conf.$d.accept_local=1
  must sysctl -q -w net.ipv4.conf.$d.rp_filter=0
done
must $RDMA link add rxeA type rxe netdev vethA
must $RDMA link add rxeB type rxe netdev vethB
$RDMA link show
for d in rxeA rxeB; do
  g=/sys/class/infiniband/$d/ports/1
  for i in 0 1; do echo "$d gid[$i] $(cat $g/gids/$i) $(cat $g/gid_attrs/types/$i) $(cat $g/gid_attrs/ndevs/$i)"; done
done

# Run a command in host A or B (RINGSOCK_DEVICE picks its rxe device for
# verbscheck and the shim).
A="$IP netns exec A env RINGSOCK_DEVICE=rxeA"
B="$IP netns exec B env RINGSOCK_DEVICE=rxeB"
SRV=10.8.0.1
echo "SHAPE netns"

# Counters that show where the bytes went: rxe hw counters, the RDMA
# wire's veth tx bytes, the TCP wire's veth tx bytes (ctlA/ctlB live in
# their namespaces: `ip netns exec` mounts that namespace's sysfs).
cnt() { # one "k=v" each
  for d in rxeA rxeB; do
    echo "${d}_sent=$(cat /sys/class/infiniband/$d/ports/1/hw_counters/sent_pkts)"
    echo "${d}_rcvd=$(cat /sys/class/infiniband/$d/ports/1/hw_counters/rcvd_pkts)"
  done
  for d in vethA vethB; do echo "${d}_tx=$(cat /sys/class/net/$d/statistics/tx_bytes)"; done
  for n in A B; do echo "ctl${n}_tx=$($IP netns exec $n cat /sys/class/net/ctl$n/statistics/tx_bytes)"; done
}
val() { echo "$1" | sed -n "s/^$2=//p"; }
# delta BEFORE AFTER KEY: how far a counter moved (0 if it is missing, so
# a check fails instead of the shell's arithmetic).
delta() { a=$(val "$2" $3); b=$(val "$1" $3); echo $(( ${a:-0} - ${b:-0} )); }
