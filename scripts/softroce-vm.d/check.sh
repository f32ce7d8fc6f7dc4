# Guest script for scripts/softroce-vm (busybox sh, run as /guest.sh):
# two "hosts" (network namespaces A and B joined by a veth pair, an rxe
# device on each end) if rxe works there, else one namespace with a dummy
# device and one rxe device (SOFT-ROCE.md). Then: ibv_devinfo, ib_write_lat,
# verbscheck stream (checksums must match, over verbs, no lost wakeup),
# verbscheck ping-pong/bw over verbs, kernel TCP, and TCP under rsocket's
# preload. Exit status 0 only if the stream checks passed.
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

gid_of() { # NETNS-PREFIX DEVICE -> the gid index verbscheck would choose
  $1 env RINGSOCK_DEVICE=$2 verbscheck info 2>&1
}

shape=none
step "two namespaces: veth pair, rxe on each end"
if $IP netns add A && $IP netns add B \
  && $IP link add vethA type veth peer name vethB \
  && $IP link set vethA netns A && $IP link set vethB netns B \
  && $IP -n A addr add 10.9.0.1/24 dev vethA && $IP -n B addr add 10.9.0.2/24 dev vethB \
  && $IP -n A link set vethA up && $IP -n B link set vethB up \
  && $IP -n A link set lo up && $IP -n B link set lo up \
  && $IP netns exec A $RDMA link add rxeA type rxe netdev vethA \
  && $IP netns exec B $RDMA link add rxeB type rxe netdev vethB; then
  $RDMA link show
  gid_of "$IP netns exec A" rxeA
  gid_of "$IP netns exec B" rxeB
  # Sanity: one RC write round trip between the namespaces, bounded.
  $IP netns exec A env RINGSOCK_DEVICE=rxeA timeout 20 verbscheck serve --listen 10.9.0.1:7000 > /tmp/nsA.log 2>&1 &
  nspid=$!
  sleep 1
  if $IP netns exec B env RINGSOCK_DEVICE=rxeB timeout 20 verbscheck pingpong --connect 10.9.0.1:7000 \
       --sizes 64 --iters 20 --bw-mib 1 --reps 1 > /tmp/nsB.log 2>&1; then
    shape=netns
    cat /tmp/nsB.log
  else
    echo "rxe across network namespaces FAILED:"
    cat /tmp/nsB.log /tmp/nsA.log
    dmesg | grep -i -E 'rxe|rdma' | tail -n 5
  fi
  kill $nspid 2>/dev/null; wait $nspid 2>/dev/null
else
  echo "setting up rxe over veth in two namespaces FAILED (see above)"
fi

if [ $shape = netns ]; then
  A="$IP netns exec A env RINGSOCK_DEVICE=rxeA"
  B="$IP netns exec B env RINGSOCK_DEVICE=rxeB"
  SRV=10.9.0.1
  DEVA=rxeA; DEVB=rxeB
else
  step "fallback: one namespace, rsdummy0 + rxe0"
  $IP netns exec A $RDMA link delete rxeA 2>/dev/null
  $IP netns exec B $RDMA link delete rxeB 2>/dev/null
  $IP netns delete A 2>/dev/null; $IP netns delete B 2>/dev/null
  $IP link add rsdummy0 type dummy && $IP addr add 10.0.0.1/24 dev rsdummy0 \
    && $IP link set rsdummy0 up && $RDMA link add rxe0 type rxe netdev rsdummy0 || { echo "rxe0 setup failed"; exit 3; }
  A="env RINGSOCK_DEVICE=rxe0"
  B="env RINGSOCK_DEVICE=rxe0"
  SRV=10.0.0.1
  DEVA=rxe0; DEVB=rxe0
  sleep 1
fi
echo "SHAPE $shape"

step "ibv_devinfo"
ibv_devinfo -d $DEVA | head -n 20
$A verbscheck info

step "ib_write_lat (perftest, sanity)"
gidx=$($A verbscheck info | sed -n 's/.*gid_index=\([0-9]*\).*/\1/p')
$A timeout 30 ib_write_lat -d $DEVA -x $gidx -n 200 > /tmp/lat_srv.log 2>&1 &
lpid=$!
sleep 1
$B timeout 30 ib_write_lat -d $DEVB -x $gidx -n 200 $SRV > /tmp/lat.log 2>&1
echo "ib_write_lat exit $?"
grep -E '^ *#bytes|^ *2 ' /tmp/lat.log || tail -n 5 /tmp/lat.log
wait $lpid 2>/dev/null

step "servers"
$A verbscheck serve --listen $SRV:7001 > /tmp/vsrv.log 2>&1 &
vpid=$!
$A verbscheck tcp-serve --listen $SRV:7002 > /tmp/tsrv.log 2>&1 &
tpid=$!
$A LD_PRELOAD=$RSPRELOAD verbscheck tcp-serve --listen $SRV:7003 > /tmp/rsrv.log 2>&1 &
rpid=$!
sleep 1

step "stream over verbs: $MIB MiB each way, random write sizes, checksums"
$B timeout 60 verbscheck stream --connect $SRV:7001 --mib $MIB | tee /tmp/stream.log
line=$(grep 'RESULT transport=verbs test=stream' /tmp/stream.log)
case "$line" in
  *" ok=1"*) ;;
  *) echo "CHECK FAILED: verbs stream checksums did not match (or no result)"; fail=1 ;;
esac
case "$line" in
  *device=rxe*" lost_wakeups=0 peer_lost_wakeups=0 "*) ;;
  *) echo "CHECK FAILED: stream did not run over an rxe device, or lost a wakeup"; fail=1 ;;
esac
case "$line" in
  *" ring_tx_bytes=0 "*|"") echo "CHECK FAILED: no bytes went through the verbs ring"; fail=1 ;;
esac

step "stream over kernel TCP"
$B timeout 60 verbscheck stream --tcp --connect $SRV:7002 --mib $MIB || fail=1

step "ping-pong and bw over verbs"
$B timeout 90 verbscheck pingpong --connect $SRV:7001 --sizes $SIZES --iters $ITERS --bw-mib $BW_MIB

step "ping-pong and bw over kernel TCP"
$B timeout 90 verbscheck pingpong --tcp --connect $SRV:7002 --sizes $SIZES --iters $ITERS --bw-mib $BW_MIB

step "ping-pong and bw over TCP under rsocket's preload (librspreload.so)"
$B LD_PRELOAD=$RSPRELOAD timeout 90 verbscheck pingpong --tcp --connect $SRV:7003 --sizes $SIZES --iters $ITERS --bw-mib $BW_MIB \
  | sed 's/transport=tcp/transport=rsocket/'
echo "rsocket exit $?"

kill $vpid $tpid $rpid 2>/dev/null
t1=$(cut -d' ' -f1 /proc/uptime)
echo "GUEST-SECONDS from=$t0 to=$t1"
[ $fail -eq 0 ] && echo "VERBS-CHECK PASSED" || echo "VERBS-CHECK FAILED"
exit $fail
