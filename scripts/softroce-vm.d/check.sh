# Guest script for scripts/softroce-vm (busybox sh, run as /guest.sh): two
# "hosts" A and B (network namespaces), an rxe device each, RC traffic
# between them over a veth wire. Then: ibv_devinfo, ib_write_lat A<->B,
# verbscheck stream A<->B (checksums must match, over rxeA/rxeB, no lost
# wakeup, and the bytes must have crossed the veth wire), verbscheck
# ping-pong/bw over verbs (its counters: tails in rings and in slot
# WRITEs, 64 B messages as 64 B inline WRITEs and 4 KiB ones as 4,096 B
# WRITEs, the record headers left out) and over kernel TCP A<->B, and
# (for reference only) TCP under rsocket's preload in the root namespace.
#
# There is no fallback: if the two-host topology cannot be built or the
# verbs stream between A and B fails, the script FAILS (exit 3 for setup,
# 1 for checks).
#
# The topology, and why it looks the way it does, is in twohosts.sh
# (sourced below): rxe works in the guest kernel's initial network
# namespace only, so the RDMA wire vethA<->vethB lives there and the
# programs run in namespaces A and B with RINGSOCK_DEVICE=rxeA / rxeB,
# their TCP going over ctlA 10.8.0.1 <-> ctlB 10.8.0.2.
#
# Knobs (kernel command line cannot pass them; edit here): sizes of the runs.
MIB=8            # stream: MiB each way
ITERS=200        # ping-pong round trips per size
BW_MIB=2         # bw: MiB per transfer (median of 3)
SIZES=64,4096,65536
RSPRELOAD=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so

fail=0
t0=$(cut -d' ' -f1 /proc/uptime)
. /guest.d/twohosts.sh
$RDMA system show
$IP route get 10.9.0.2 from 10.9.0.1 oif vethA

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

step "ping-pong over verbs with both ends asleep between messages: the tails ride in the rings"
# With no spin every receive sleeps, so every request rings the server
# (standing flag). A small request's slot WRITE then carries the tail and
# the ring (FEATURE_TAIL_IN_IMM): the client's word WRITEs are its flag
# announcements, its head pushes and the tails of the requests that found
# the server not yet asleep, fewer than its tails (without the feature
# every tail is a word WRITE, so there are more word WRITEs than tails).
# How many requests find the server asleep varies from boot to boot, and
# so does how often the client itself sleeps (spin 0 still takes 32
# looks): the rings must reach at least every other message in one
# direction or the other.
# spin_pingpong PORT SPIN_US ITERS [SIZE] [GAMMA]: a verbs ping-pong of
# SIZE (64) B messages with both ends at SPIN_US (and pushing their heads
# every GAMMA slots where given), its client's RESULT line in $line (read
# with kv), the server gone afterwards.
spin_pingpong() {
  $A verbscheck serve --listen $SRV:$1 --spin-us $2 ${5:+--gamma $5} > /tmp/vsrv.$1.log 2>&1 &
  ppid=$!
  sleep 1
  $B timeout 90 verbscheck pingpong --connect $SRV:$1 --spin-us $2 --sizes ${4:-64} --iters $3 \
    ${5:+--gamma $5} --bw-mib 1 --reps 1 | tee /tmp/pp.$1.log
  line=$(grep 'RESULT transport=verbs test=pingpong' /tmp/pp.$1.log)
  kill $ppid 2>/dev/null
  wait $ppid 2>/dev/null
}
kv() { echo "$line" | sed -n "s/.* $1=\([0-9]*\).*/\1/p"; }
spin_pingpong 7004 0 100
msgs=$(kv messages); tails=$(kv ring_tail_writes); words=$(kv word_writes)
kicks=$(kv kicks_sent); rung=$(kv rings_received); lost=$(kv lost_wakeups)
if [ -n "$msgs" ] && [ -n "$tails" ] && [ -n "$words" ] && [ -n "$kicks" ] && [ -n "$rung" ] \
  && [ "$lost" = 0 ] && [ $tails -ge $msgs ] && [ $words -lt $tails ] \
  && { [ $((kicks * 2)) -ge $msgs ] || [ $((rung * 2)) -ge $msgs ]; }; then
  echo "CHECK PASS tails in rings: $msgs messages, $tails tails, $kicks rings sent, $rung received, $words word WRITEs, no lost wakeup"
else
  echo "CHECK FAILED: tails in rings: messages=$msgs tails=$tails rings_sent=$kicks rings_received=$rung word_writes=$words lost=$lost"
  fail=1
fi

step "ping-pong over verbs with both ends spinning: the tails ride in the slot WRITEs"
# Neither end sleeps (a 20 ms spin), so no tail carries a ring. Both ends
# keep a receive per incoming slot (FEATURE_TAIL_CREDITS), so each small
# message's tail goes in the immediate of its slot WRITE: the client's
# word WRITEs are only its head pushes and flag writes, far fewer than
# its tails (without the feature each tail is a word WRITE of its own).
spin_pingpong 7005 20000 200
msgs=$(kv messages); tails=$(kv ring_tail_writes); words=$(kv word_writes); lost=$(kv lost_wakeups)
posted=$(kv wr_posted)
if [ -n "$msgs" ] && [ -n "$tails" ] && [ -n "$words" ] && [ -n "$posted" ] && [ "$lost" = 0 ] \
  && [ $tails -ge $msgs ] && [ $((words * 4)) -lt $tails ] && [ $posted -lt $((tails * 3 / 2)) ]; then
  echo "CHECK PASS tails in slot WRITEs: $msgs messages, $tails tails, $words word WRITEs, $posted work requests"
else
  echo "CHECK FAILED: tails in slot WRITEs: messages=$msgs tails=$tails word_writes=$words wr_posted=$posted lost=$lost"
  fail=1
fi
# The same run's slot WRITEs carry each 64 B message's payload only: not
# the whole 256 B slot, and not the 8-byte record header either (the
# receiver writes it from the immediate, FEATURE_HEADERLESS), inline: rxe
# takes 256 B inline, so every work request is (the words are too).
sbytes=$(kv slot_bytes); swrites=$(kv slot_writes); inl=$(kv wr_inline)
if [ -n "$sbytes" ] && [ -n "$swrites" ] && [ -n "$inl" ] && [ "$swrites" -gt 0 ] \
  && [ $sbytes -le $((swrites * 64)) ] && [ $inl -ge $swrites ]; then
  echo "CHECK PASS small slot WRITEs: $swrites slot WRITEs of $sbytes bytes ($((sbytes / swrites)) each), $inl work requests inline"
else
  echo "CHECK FAILED: small slot WRITEs: slot_writes=$swrites slot_bytes=$sbytes wr_inline=$inl (want at most 64 bytes each, all inline)"
  fail=1
fi

step "4 KiB ping-pong over verbs with both ends spinning: payload-only slot WRITEs"
# A 4 KiB message with its 8-byte header is 4,104 bytes: five packets at
# rxe's 1,024 B MTU where rsocket sends four. Sent without the header
# (FEATURE_HEADERLESS) it is 4,096 bytes, four packets. The stream checks
# above carry mixed sizes through the same path with checksums.
spin_pingpong 7006 20000 100 4096
msgs=$(kv messages); sbytes=$(kv slot_bytes); swrites=$(kv slot_writes)
if [ -n "$msgs" ] && [ -n "$sbytes" ] && [ -n "$swrites" ] && [ "$swrites" -ge "$msgs" ] \
  && [ "$msgs" -gt 0 ] && [ $sbytes -le $((swrites * 4096)) ]; then
  echo "CHECK PASS 4 KiB payload-only WRITEs: $msgs messages, $swrites slot WRITEs of $sbytes bytes ($((sbytes / swrites)) each)"
else
  echo "CHECK FAILED: 4 KiB payload-only WRITEs: messages=$msgs slot_writes=$swrites slot_bytes=$sbytes (want at most 4096 bytes each)"
  fail=1
fi

step "64 B ping-pong over verbs, heads pushed every 1,024 slots: no header re-sent unasked"
# The shim's rings on RDMA push their heads every quarter ring (1,024
# slots), so up to 1,024 one-slot records wait for the push that lets the
# sender forget them. The sender keeps at most 256 headerless records;
# further ones carry their header (the same single inline WRITE at 64 B).
# The build before re-sent the whole list whenever it filled: 0.75 header
# WRITEs per message on top of the message's own (ringsock-ctl status of a
# shim ping-pong: 14,592 re-sent for 19,548 messages).
spin_pingpong 7007 20000 1000 64 1024
msgs=$(kv messages); hl=$(kv headerless_writes); resent=$(kv headers_resent); posted=$(kv wr_posted)
if [ -n "$msgs" ] && [ -n "$hl" ] && [ -n "$resent" ] && [ -n "$posted" ] && [ "$msgs" -gt 0 ] \
  && [ $hl -ge 256 ] && [ $((resent * 10)) -lt $msgs ] && [ $posted -lt $((msgs * 5 / 4)) ]; then
  echo "CHECK PASS late head pushes: $msgs messages, $hl without their header, $resent headers re-sent, $posted work requests"
else
  echo "CHECK FAILED: late head pushes: messages=$msgs headerless_writes=$hl headers_resent=$resent wr_posted=$posted (want at least 256 headerless, re-sent under a tenth of the messages)"
  fail=1
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
