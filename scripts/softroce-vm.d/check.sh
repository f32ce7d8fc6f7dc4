# Guest script for scripts/softroce-vm (busybox sh, run as /guest.sh): two
# "hosts" A and B (network namespaces), an rxe device each, RC traffic
# between them over a veth wire. Then: ibv_devinfo, ib_write_lat A<->B,
# verbscheck stream A<->B (checksums must match, over rxeA/rxeB, no lost
# wakeup, and the bytes must have crossed the veth wire), verbscheck
# ping-pong/bw over verbs and over kernel TCP A<->B, and (for reference
# only) TCP under rsocket's preload in the root namespace.
#
# There is no fallback: if the two-host topology cannot be built or the
# verbs stream between A and B fails, the script FAILS (exit 3 for setup,
# 1 for checks).
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
#   perftest's exchange) goes over a second veth pair ctlA (10.8.0.1, in A)
#   <-> ctlB (10.8.0.2, in B): a host's management network next to its
#   RDMA NIC.
# rsocket resolves addresses with rdma_cm in the caller's namespace, where
# no rxe netdev lives, so it cannot run A<->B on this kernel; its numbers
# come from the root namespace, both ends on rxeA (rxe loopback).
#
# Knobs (kernel command line cannot pass them; edit here): sizes of the runs.
MIB=8            # stream: MiB each way
ITERS=200        # ping-pong round trips per size
BW_MIB=2         # bw: MiB per transfer (median of 3)
SIZES=64,4096,65536
RSPRELOAD=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so

# busybox sh runs its own applets before PATH: call iproute2 by path.
IP=/usr/sbin/ip; [ -x $IP ] || IP=/sbin/ip
RDMA=/usr/bin/rdma; [ -x $RDMA ] || RDMA=/usr/sbin/rdma

fail=0
step() { echo; echo "=== $*"; }
t0=$(cut -d' ' -f1 /proc/uptime)

step "two hosts: namespaces A and B, RDMA wire vethA<->vethB, control wire ctlA<->ctlB"
# Any setup step failing fails the run (exit 3): there is no fallback.
must() { "$@" || { echo "SETUP FAILED: $*"; exit 3; }; }
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
$RDMA system show
$RDMA link show
$IP route get 10.9.0.2 from 10.9.0.1 oif vethA
for d in rxeA rxeB; do
  g=/sys/class/infiniband/$d/ports/1
  for i in 0 1; do echo "$d gid[$i] $(cat $g/gids/$i) $(cat $g/gid_attrs/types/$i) $(cat $g/gid_attrs/ndevs/$i)"; done
done

A="$IP netns exec A env RINGSOCK_DEVICE=rxeA"
B="$IP netns exec B env RINGSOCK_DEVICE=rxeB"
SRV=10.8.0.1
echo "SHAPE netns"

# Counters that show where the bytes went.
cnt() { # rxe hw counters and veth tx bytes, one "k=v" each
  for d in rxeA rxeB; do
    echo "${d}_sent=$(cat /sys/class/infiniband/$d/ports/1/hw_counters/sent_pkts)"
    echo "${d}_rcvd=$(cat /sys/class/infiniband/$d/ports/1/hw_counters/rcvd_pkts)"
  done
  for d in vethA vethB; do echo "${d}_tx=$(cat /sys/class/net/$d/statistics/tx_bytes)"; done
}
val() { echo "$1" | sed -n "s/^$2=//p"; }

step "ibv_devinfo, verbscheck info"
ibv_devinfo -d rxeA | head -n 20
$A verbscheck info
$B verbscheck info
gidA=$($A verbscheck info | sed -n 's/.*gid_index=\([0-9]*\).*/\1/p')
gidB=$($B verbscheck info | sed -n 's/.*gid_index=\([0-9]*\).*/\1/p')

step "ib_write_lat A<->B (perftest, sanity)"
$IP netns exec A timeout 30 ib_write_lat -d rxeA -x $gidA -n 200 > /tmp/lat_srv.log 2>&1 &
lpid=$!
sleep 1
$IP netns exec B timeout 30 ib_write_lat -d rxeB -x $gidB -n 200 $SRV > /tmp/lat.log 2>&1
echo "ib_write_lat exit $?"
grep -E '^ *#bytes|^ *2 ' /tmp/lat.log || tail -n 5 /tmp/lat.log
wait $lpid 2>/dev/null

step "servers in A"
$A verbscheck serve --listen $SRV:7001 > /tmp/vsrv.log 2>&1 &
vpid=$!
$A verbscheck tcp-serve --listen $SRV:7002 > /tmp/tsrv.log 2>&1 &
tpid=$!
sleep 1

step "stream over verbs B->A and A->B: $MIB MiB each way, random write sizes, checksums"
before=$(cnt)
$B timeout 60 verbscheck stream --connect $SRV:7001 --mib $MIB | tee /tmp/stream.log
after=$(cnt)
line=$(grep 'RESULT transport=verbs test=stream' /tmp/stream.log)
case "$line" in
  *" ok=1"*) ;;
  *) echo "CHECK FAILED: verbs stream checksums did not match (or no result)"; fail=1 ;;
esac
case "$line" in
  *device=rxeB*" lost_wakeups=0 peer_lost_wakeups=0 "*) ;;
  *) echo "CHECK FAILED: the client in B did not run over rxeB, or a wakeup was lost"; fail=1 ;;
esac
case "$line" in
  *" ring_tx_bytes=0 "*|"") echo "CHECK FAILED: no bytes went through the verbs ring"; fail=1 ;;
esac
grep -q 'via rxeA' /tmp/vsrv.log || { echo "CHECK FAILED: the server in A is not on rxeA"; fail=1; }
# Both directions carried MIB MiB of slots: each veth end must have sent at
# least that, and each rxe device must have sent and received packets. Over
# rxe loopback (one device, or a path through lo) these do not move.
for k in rxeA_sent rxeA_rcvd rxeB_sent rxeB_rcvd vethA_tx vethB_tx; do
  a=$(val "$after" $k); b=$(val "$before" $k)
  d=$(( ${a:-0} - ${b:-0} ))
  echo "WIRE $k +$d"
  case $k in
    veth*) min=$((MIB * 1048576)) ;;
    *) min=1 ;;
  esac
  [ $d -ge $min ] || { echo "CHECK FAILED: $k moved by $d (< $min): the stream did not cross the vethA<->vethB wire"; fail=1; }
done

step "stream over kernel TCP B->A (ctl wire)"
$B timeout 60 verbscheck stream --tcp --connect $SRV:7002 --mib $MIB || fail=1

step "ping-pong and bw over verbs B->A"
if ! $B timeout 90 verbscheck pingpong --connect $SRV:7001 --sizes $SIZES --iters $ITERS --bw-mib $BW_MIB; then
  echo "CHECK FAILED: verbs ping-pong/bw between A and B"; fail=1
fi

step "ping-pong and bw over kernel TCP B->A (ctl wire)"
$B timeout 90 verbscheck pingpong --tcp --connect $SRV:7002 --sizes $SIZES --iters $ITERS --bw-mib $BW_MIB

kill $vpid $tpid 2>/dev/null
wait $vpid $tpid 2>/dev/null

step "reference: ping-pong and bw over TCP under rsocket's preload, root namespace, both ends on rxeA (loopback)"
LD_PRELOAD=$RSPRELOAD verbscheck tcp-serve --listen 10.9.0.1:7003 > /tmp/rsrv.log 2>&1 &
rpid=$!
sleep 1
r0=$(cat /sys/class/infiniband/rxeA/ports/1/hw_counters/sent_pkts)
LD_PRELOAD=$RSPRELOAD timeout 90 verbscheck pingpong --tcp --connect 10.9.0.1:7003 --sizes $SIZES --iters $ITERS --bw-mib $BW_MIB \
  | sed 's/transport=tcp/transport=rsocket/'
echo "rsocket exit $? (rxeA sent_pkts +$(( $(cat /sys/class/infiniband/rxeA/ports/1/hw_counters/sent_pkts) - r0 )))"
kill $rpid 2>/dev/null

t1=$(cut -d' ' -f1 /proc/uptime)
echo "GUEST-SECONDS from=$t0 to=$t1"
[ $fail -eq 0 ] && echo "VERBS-CHECK PASSED" || echo "VERBS-CHECK FAILED"
exit $fail
