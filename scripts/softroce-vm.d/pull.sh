# Guest script for scripts/softroce-vm (busybox sh, run as /guest.sh): the
# verbs transport's pull mode (remote fetching: the receiver READs the
# sender's published tail and slots) between hosts A and B
# (twohosts.sh), the verbs ring library and then the shim.
#
#   1. verbscheck stream B<->A (checksummed, random write sizes, both
#      directions at once) in forced push, forced pull and adaptive mode
#      (thresholds that may make it switch). Each must match its
#      checksums and lose no wakeup; push must not switch or READ; pull
#      must switch each direction to pull once, READ at least the payload
#      and WRITE few slots.
#   2. adaptive many-switch run: verbscheck rpc (2 clients, every reply
#      byte checked) against an adaptive rpc-serve whose thresholds flip
#      it at nearly every reply: at least 2 switches each way, and at
#      least one header re-sent before a switch's tail word (replies
#      sent without their header, FEATURE_HEADERLESS).
#   3. verbscheck ping-pong in forced pull (sleep/kick across READs: no
#      lost wakeup).
#   4. the shim ignores RINGSOCK_VERBS_MODE=pull (its rings always push,
#      docs/limits.md): streamcheck A<->B (--mode mixed) with the knob in
#      both shims: hashes match, status says rdma in both daemons, each
#      shim logs the knob as ignored, the connections' slot WRITE
#      bytes are at least half of what they sent, and `ringsock-ctl
#      status --json` shows their pull counters (tx_to_pull, rx_to_pull,
#      tail_reads, slot_reads) in every report with verbs counters, all
#      zero.
# One "CHECK PASS|FAIL name: ..." line per check; exit 1 if any failed.
MIB=2          # stream MiB each way per mode
PP_ITERS=100   # ping-pong round trips per size
SC_MIB=2       # shim streamcheck MiB each way per connection

fail=0
t0=$(cut -d' ' -f1 /proc/uptime)
. /guest.d/twohosts.sh
pass() { echo "CHECK PASS $*"; }
bad() { echo "CHECK FAIL $*"; fail=1; }
kv() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }

# stream_mode NAME PORT ENV...: a verbscheck server in A and a stream
# client in B, both with ENV; leaves the client's RESULT line in $line.
stream_mode() {
  name=$1; port=$2; shift 2
  $A "$@" verbscheck serve --listen $SRV:$port > /tmp/vsrv.$name.log 2>&1 &
  vpid=$!
  sleep 1
  $B "$@" timeout 60 verbscheck stream --connect $SRV:$port --mib $MIB > /tmp/vs.$name.log 2>&1
  echo "    client exit $? [t=$(uptime_s)]"
  kill $vpid 2>/dev/null; wait $vpid 2>/dev/null
  line=$(grep 'RESULT transport=verbs test=stream' /tmp/vs.$name.log)
  echo "$line" | tr ' ' '\n' | grep -E "^(secs|mbps_both|ok|lost_wakeups|peer_lost_wakeups|slot_bytes|ring_tail_writes|pull_.*)=" | tr '\n' ' '
  echo
  if [ "$(kv "$line" ok)" = 1 ] && [ "$(kv "$line" lost_wakeups)" = 0 ] && [ "$(kv "$line" peer_lost_wakeups)" = 0 ]; then
    pass "$name stream: $MIB MiB each way, checksums match both ways, no lost wakeup"
  else
    bad "$name stream: checksums, result or wakeups wrong"
    tail -n 5 /tmp/vs.$name.log /tmp/vsrv.$name.log | sed 's/^/    /'
  fi
}

step "verbs ring library, forced push"
stream_mode push 7301 RINGSOCK_VERBS_MODE=push
if [ "$(kv "$line" pull_tx_to_pull)" = 0 ] && [ "$(kv "$line" pull_rx_to_pull)" = 0 ] && [ "$(kv "$line" pull_tail_reads)" = 0 ]; then
  pass "push: no switch, no READ"
else bad "push: switched or READ: $(echo "$line" | tr ' ' '\n' | grep pull_ | tr '\n' ' ')"; fi

step "verbs ring library, forced pull"
stream_mode pull 7302 RINGSOCK_VERBS_MODE=pull
rb=$(kv "$line" pull_read_bytes)
if [ "$(kv "$line" pull_tx_to_pull)" = 1 ] && [ "$(kv "$line" pull_rx_to_pull)" = 1 ] \
   && [ "$(kv "$line" pull_tx_to_push)" = 0 ] && [ "${rb:-0}" -ge $((MIB * 1048576)) ]; then
  pass "pull: each direction switched to pull once, $rb bytes READ (payload $((MIB * 1048576)))"
else bad "pull: switches or READ bytes wrong: $(echo "$line" | tr ' ' '\n' | grep pull_ | tr '\n' ' ')"; fi
# The client's slot WRITEs: only what went out before the first tail.
sb=$(kv "$line" slot_bytes)
if [ "${sb:-0}" -lt $((MIB * 1048576 / 4)) ]; then pass "pull: slot WRITE bytes $sb, far below the payload"
else bad "pull: slot WRITE bytes $sb: the data was pushed"; fi

step "verbs ring library, adaptive with switching thresholds"
# A 1 us window makes the rate the inverse of the last gap between two
# publishes of the process: gaps under 1 ms pull, longer ones push.
AD="RINGSOCK_VERBS_MODE=adaptive RINGSOCK_PULL_HIGH=1000 RINGSOCK_PULL_LOW=1000 RINGSOCK_PULL_WINDOW_US=1 RINGSOCK_PULL_DWELL_MS=0"
stream_mode adaptive 7303 $AD
# The stream publishes only ~60 tails, so whether it switches depends on
# the guest's timing: its switches are reported, the rpc run below is what
# must switch.
echo "    adaptive stream switches: tx $(kv "$line" pull_tx_to_pull) to pull / $(kv "$line" pull_tx_to_push) to push"

# Round trips: under TCG a pushed reply comes back in well under 1 ms and
# a pulled one in several, so an adaptive server flips at nearly every
# reply; the client checks every byte of every reply.
$A $AD verbscheck rpc-serve --listen $SRV:7306 > /tmp/rs.ad.log 2>&1 &
spid=$!
sleep 0.5
$B RINGSOCK_VERBS_MODE=push timeout 60 verbscheck rpc --connect $SRV:7306 --clients 2 --sizes 64,4096 \
  --secs 2 --spin-us 200 > /tmp/rc.ad.log 2>&1
rc=$?
sleep 0.5
kill $spid 2>/dev/null; wait $spid 2>/dev/null
grep RESULT /tmp/rc.ad.log /tmp/rs.ad.log | cut -c1-400 | sed 's/^/    /'
n=$(grep 'test=rpc ' /tmp/rc.ad.log | grep ' ok=1 ' | grep -c ' bad_replies=0 ')
sw=$(awk '/test=rpc-serve/ { for (i = 1; i <= NF; i++) { split($i, kv, "=")
       if (kv[1] == "pull_tx_to_pull") p += kv[2]; if (kv[1] == "pull_tx_to_push") q += kv[2];
       if (kv[1] == "pull_catchup_writes") c += kv[2]
       if (kv[1] == "headerless_writes") h += kv[2]; if (kv[1] == "headers_resent") r += kv[2] } }
     END { print p + 0, q + 0, c + 0, h + 0, r + 0 }' /tmp/rs.ad.log)
set -- $sw
# Each switch to pull writes a tail word, before which the server re-sends
# the headers of replies it sent without one (FEATURE_HEADERLESS) that the
# client's pushed head has not passed: the re-send path must have run,
# with every reply byte checked.
if [ $rc -eq 0 ] && [ "$n" -eq 2 ] && [ "$1" -ge 2 ] && [ "$2" -ge 2 ] && [ "$4" -ge 1 ] && [ "$5" -ge 1 ]; then
  pass "adaptive rpc: every reply byte checked, no lost wakeup, the server switched $1 times to pull and $2 back (catch-up WRITEs $3), sent $4 replies without their header and re-sent $5 headers"
else bad "adaptive rpc: exit $rc, $n of 2 sizes ok, server switches to pull $1 / to push $2, headerless replies $4, headers re-sent $5"; tail -n 3 /tmp/rc.ad.log /tmp/rs.ad.log; fi

step "verbs ping-pong, forced pull"
$A RINGSOCK_VERBS_MODE=pull verbscheck serve --listen $SRV:7304 > /tmp/vsrv.pp.log 2>&1 &
vpid=$!
sleep 1
$B RINGSOCK_VERBS_MODE=pull timeout 90 verbscheck pingpong --connect $SRV:7304 --sizes 64,4096 \
  --iters $PP_ITERS --bw-mib 1 --reps 1 > /tmp/vs.pp.log 2>&1
rc=$?
kill $vpid 2>/dev/null; wait $vpid 2>/dev/null
grep RESULT /tmp/vs.pp.log | sed 's/^/    /'
n=$(grep 'test=pingpong' /tmp/vs.pp.log | grep -c ' lost_wakeups=0 .*pull_rx_to_pull=1 ')
if [ $rc -eq 0 ] && [ "$n" -eq 2 ]; then pass "pull ping-pong: 64 B and 4 KiB round trips over READs, no lost wakeup"
else bad "pull ping-pong: exit $rc, $n of 2 sizes pulled without a lost wakeup"; tail -n 5 /tmp/vs.pp.log; fi

step "shim with RINGSOCK_VERBS_MODE=pull in both hosts: it keeps pushing"
. /guest.d/shimhosts.sh
SA="$SA RINGSOCK_VERBS_MODE=pull"
SB="$SB RINGSOCK_VERBS_MODE=pull"
la=$(wc -l < /tmp/shimA.log); lb=$(wc -l < /tmp/shimB.log)
port=7305
$SA streamcheck server --host $SRV --port $port --mib $SC_MIB --conns 2 --mode mixed --pause-ms 1000 --timeout-s 30 \
  > /tmp/sc.srv 2>&1 &
spid=$!
wait_listen A $port || bad "shim: server did not listen"
sample_start shim
timeout 40 $SB streamcheck client --host $SRV --port $port --mib $SC_MIB --conns 2 --mode mixed --pause-ms 1000 \
  --timeout-s 30 > /tmp/sc.cli 2>&1
echo "    client exit $? [t=$(uptime_s)]"
i=0
while kill -0 $spid 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
stop $spid
sample_stop shim
n=$(awk 'FNR == NR { if ($1 == "conn") s[$2] = $4 " " $5 " " $7 " " $8; next }
         $1 == "conn" && ($2 in s) && s[$2] == $7 " " $8 " " $4 " " $5 && $4 == want && $7 == want { n++ }
         END { print n + 0 }' want=$((SC_MIB * 1048576)) /tmp/sc.srv /tmp/sc.cli)
grep -qx ok /tmp/sc.srv && grep -qx ok /tmp/sc.cli || n=0
if [ "$n" -eq 2 ]; then
  pass "shim data: 2 connections x $SC_MIB MiB each way, hashes match both ways"
else
  bad "shim data: streamcheck failed or hashes differ ($n of 2 matched)"
  tail -n 5 /tmp/sc.srv /tmp/sc.cli /tmp/shimA.log /tmp/shimB.log | sed 's/^/    /'
fi
# The shim's rings push whatever RINGSOCK_VERBS_MODE says: a pulling
# ring's unfetched data would live in a process that may exit without
# closing (docs/limits.md). Both shims say they ignore the knob.
said=$(tail -n +$((la + 1)) /tmp/shimA.log | grep -c 'RINGSOCK_VERBS_MODE="pull" ignored')
said=$((said + $(tail -n +$((lb + 1)) /tmp/shimB.log | grep -c 'RINGSOCK_VERBS_MODE="pull" ignored')))
if [ "$said" -eq 2 ]; then pass "shim pull knob: both shims logged that their rdma connections push"
else bad "shim pull knob: $said of 2 shims logged the knob as ignored"; fi
busy=0; okb=0
for h in A B; do
  expect_status "shim transport $h" --from /tmp/st.shim.$h --port $port \
    --expect "transport=rdma,ends>=1"
  # Every report of a connection that sent at least 1 MiB: its slot WRITE
  # bytes are at least half of what it sent (pushed, not READ).
  awk -v want=":$port\"" '{ n = split($0, c, "\"session\":")
      for (i = 2; i <= n; i++) if (index(c[i], want)) {
        ob = -1; sb = -1
        if (match(c[i], /"out_bytes":[0-9]+/)) ob = substr(c[i], RSTART + 12, RLENGTH - 12) + 0
        if (match(c[i], /"slot_bytes":[0-9]+/)) sb = substr(c[i], RSTART + 13, RLENGTH - 13) + 0
        if (ob >= 1048576) { big++; if (sb * 2 >= ob) ok++; else print "    not pushed: out_bytes " ob " slot_bytes " sb }
      } }
      END { print big + 0, ok + 0 }' /tmp/st.shim.$h | tail -n 4 > /tmp/sb.$h
  sed '$d' /tmp/sb.$h
  set -- $(tail -n 1 /tmp/sb.$h)
  busy=$((busy + ${1:-0})); okb=$((okb + ${2:-0}))
done
if [ $busy -gt 0 ] && [ $busy = $okb ]; then
  pass "shim wire: in all $busy reports of connections past 1 MiB, slot WRITE bytes >= half the bytes sent (pushed)"
else bad "shim wire: $okb of $busy reports past 1 MiB were pushed"; fi
# Status carries the pull-mode counters of each end's region header: every
# report of these connections with verbs counters (wr_posted: the daemon
# read the region) has them, and none switched or READ.
set -- $(awk -v want=":$port\"" '{ n = split($0, c, "\"session\":")
    for (i = 2; i <= n; i++) if (index(c[i], want) && index(c[i], "\"wr_posted\":")) {
      seen++; k = 0; z = 0
      split("tx_to_pull rx_to_pull tail_reads slot_reads", names, " ")
      for (j = 1; j <= 4; j++) if (match(c[i], "\"" names[j] "\":[0-9]+")) {
        k++; if (substr(c[i], RSTART + length(names[j]) + 3, RLENGTH - length(names[j]) - 3) + 0 == 0) z++
      }
      if (k == 4) has++; if (z == 4) zero++
    } }
    END { print seen + 0, has + 0, zero + 0 }' /tmp/st.shim.A /tmp/st.shim.B)
if [ "$1" -gt 0 ] && [ "$2" = "$1" ] && [ "$3" = "$1" ]; then
  pass "shim status: all $1 reports with verbs counters show the pull counters, all zero (no switch, no READ)"
else bad "shim status: of $1 reports with verbs counters, $2 show the pull counters and $3 have them all zero"; fi

t1=$(cut -d' ' -f1 /proc/uptime)
echo "GUEST-SECONDS from=$t0 to=$t1"
[ $fail -eq 0 ] && echo "PULL-CHECK PASSED" || echo "PULL-CHECK FAILED"
exit $fail
