# Guest script for scripts/softroce-vm (busybox sh, run as /guest.sh):
# libringsock.so between two hosts over RDMA verbs. Two "hosts" A and B
# (network namespaces, twohosts.sh), a ringsock-ctl daemon in each (they
# forward offers to each other on TCP 7471 over the ctlA<->ctlB wire), and
# UNMODIFIED programs under the shim, server in A, client in B:
#   streamcheck (checksummed stream both ways, 2 connections), iperf3 (B->A
#   and A->B with -R), sockperf ping-pong, redis-server + redis-benchmark +
#   redis-cli (request counts, a sha256-checked value).
# Each of these must be on transport "rdma" in both daemons' status
# (sampled every 0.2 s while it runs; a single "tcp" or "shm" report of one
# of its connections fails), its data must be right, and its bytes must
# have crossed the RDMA wire (vethA/vethB tx bytes at least the payload,
# rxe hw counters moving) and not the TCP wire (ctlA/ctlB tx bytes below
# half the payload).
# Zero-copy (RINGSOCK_ZEROCOPY_MIN=65536, both ends): streamcheck (writes
# up to 256 KiB) and zcreuse (1 MiB blocks from buffers whose pages change
# under the same address: free + malloc, munmap + mmap, MADV_DONTNEED; the
# server checks every byte, so a stale registration fails it) on "rdma",
# data right, each shim's log must say a send went zero-copy, and the
# sending host's `ringsock-ctl status --json` must show the connection's
# zc_writes > 0 and zc_bytes >= RINGSOCK_ZEROCOPY_MIN in some sample
# (zero-copy WRITEs are also folded into slot_writes there).
# Then the fallbacks, which must be on "tcp" with correct data, their bytes
# on the ctl wire:
#   - a shimmed client in B to servers in A that are not shimmed
#     (streamcheck, iperf3);
#   - a shimmed client in B that may not lock memory for its rings (no
#     CAP_IPC_LOCK, RLIMIT_MEMLOCK 64 KiB), to a shimmed server in A: a
#     shim log line must name the locked-memory limit. First verbscheck
#     (the verbs library alone) shows that the limit really stops a
#     registration there.
# Last, the RDMA wire goes down mid-stream, for 1 s and then for longer
# than the queue pairs retry: every byte checked both times, and after the
# long outage both shims must say they left the ring for TCP. Then the
# server is stopped while the client's wire fails, so that its answer to
# the client's leave header comes after the client's connect timeout: the
# connection waits for it on TCP, and every byte still arrives once.
# One "CHECK PASS|FAIL name: ..." line per check; exit 1 if any failed.
#
# iperf3's sender and receiver byte counts agree only in -R mode with -n
# (the client is the receiver and reads exactly -n bytes; the server may
# have written more -l blocks by the time it hears the test ended). In
# the forward direction the server stops counting when the client's
# TEST_END arrives, even on kernel TCP, so a forward test checks only
# 0 < received <= sent.
IPERF_BYTES=8M      # per iperf3 run
IPERF_WANT=8388608  # IPERF_BYTES in bytes
RING_BYTES=1048576  # one ring's payload: RINGSOCK_RING_SLOTS x RINGSOCK_SLOT_SIZE (defaults)
SC_MIB=4            # streamcheck: MiB each way per connection
SC_CONNS=2
FB_MIB=2            # fallback streams: MiB each way
PP_SECS=3           # sockperf ping-pong seconds
PP_SIZE=64
REDIS_N=1000        # redis-benchmark requests per test
REDIS_D=1024        # its value size
MEMLOCK_KB=64       # the low RLIMIT_MEMLOCK of the locked-memory check
ZC_MIN=65536        # RINGSOCK_ZEROCOPY_MIN of the zero-copy checks
ZC_MIB=4            # zero-copy streamcheck: MiB each way (1 connection)
OUT_MIB=16          # wire outage streamcheck: MiB each way (1 connection)
OUT_SECS=4          # how long the RDMA wire is down (past the retries)
OUT_SHORT_SECS=1    # and for a stall the queue pairs ride out

fail=0
npass=0
nfail=0
t0=$(cut -d' ' -f1 /proc/uptime)
. /guest.d/twohosts.sh

pass() { echo "CHECK PASS $*"; npass=$((npass + 1)); }
bad() { echo "CHECK FAIL $*"; nfail=$((nfail + 1)); fail=1; }

. /guest.d/shimhosts.sh

# wire NAME BEFORE AFTER A2B B2A MODE: the payload (bytes A->B, B->A)
# crossed the RDMA wire (MODE rdma) or the TCP wire (MODE tcp).
wire() {
  name=$1; b4=$2; af=$3; a2b=$4; b2a=$5; mode=$6
  vA=$(delta "$b4" "$af" vethA_tx); vB=$(delta "$b4" "$af" vethB_tx)
  cA=$(delta "$b4" "$af" ctlA_tx); cB=$(delta "$b4" "$af" ctlB_tx)
  sA=$(delta "$b4" "$af" rxeA_sent); rA=$(delta "$b4" "$af" rxeA_rcvd)
  sB=$(delta "$b4" "$af" rxeB_sent); rB=$(delta "$b4" "$af" rxeB_rcvd)
  echo "    wire $name: payload A->B $a2b B->A $b2a; RDMA wire vethA_tx +$vA vethB_tx +$vB (rxeA sent +$sA rcvd +$rA, rxeB sent +$sB rcvd +$rB); TCP wire ctlA_tx +$cA ctlB_tx +$cB"
  if [ $mode = rdma ]; then
    ok=1
    [ $vA -ge $a2b ] && [ $vB -ge $b2a ] || ok=0
    if [ $a2b -gt 0 ]; then [ $sA -gt 0 ] && [ $rB -gt 0 ] || ok=0; fi
    if [ $b2a -gt 0 ]; then [ $sB -gt 0 ] && [ $rA -gt 0 ] || ok=0; fi
    if [ $ok = 1 ]; then pass "$name wire: the payload crossed the RDMA wire"; else
      bad "$name wire: the RDMA wire (vethA/vethB, rxe counters) carried less than the payload"; fi
    # The TCP wire must not have carried the payload (checked where the
    # payload dwarfs the daemons' and the handshakes' bytes).
    if [ $a2b -ge 262144 ] || [ $b2a -ge 262144 ]; then
      if [ $((cA * 2)) -lt $a2b ] || [ $a2b -lt 262144 ]; then
        if [ $((cB * 2)) -lt $b2a ] || [ $b2a -lt 262144 ]; then
          pass "$name wire: the TCP wire carried less than half the payload"
        else bad "$name wire: ctlB sent $cB bytes, the payload B->A was $b2a: it went over TCP"; fi
      else bad "$name wire: ctlA sent $cA bytes, the payload A->B was $a2b: it went over TCP"; fi
    fi
  else
    if [ $cA -ge $a2b ] && [ $cB -ge $b2a ]; then pass "$name wire: the payload crossed the TCP wire"
    else bad "$name wire: the TCP wire (ctlA/ctlB) carried less than the payload"; fi
  fi
}

# streamcheck's hashes: the client's sent bytes are the server's received
# ones and back, connection by connection, and both printed "ok".
sc_verdict() { # NAME SERVERLOG CLIENTLOG CONNS MIB
  n=$(awk 'FNR == NR { if ($1 == "conn") s[$2] = $4 " " $5 " " $7 " " $8; next }
           $1 == "conn" && ($2 in s) && s[$2] == $7 " " $8 " " $4 " " $5 && $4 == want && $7 == want { n++ }
           END { print n + 0 }' want=$(($5 * 1048576)) "$2" "$3")
  if grep -qx ok "$2" && grep -qx ok "$3" && [ "$n" -eq "$4" ]; then
    pass "$1 data: $4 connections x $5 MiB each way, FNV-1a hashes match both ways"
  else
    bad "$1 data: streamcheck failed or hashes differ ($n of $4 connections matched)"
    echo "    server:"; tail -n 5 "$2" | sed 's/^/      /'
    echo "    client:"; tail -n 5 "$3" | sed 's/^/      /'
    # What the shims and daemons said, for a failure that does not repeat.
    for f in shimA shimB ctlA ctlB; do
      echo "    $f.log:"; tail -n 15 /tmp/$f.log | sed 's/^/      /'
    done
  fi
}

# streamcheck server in A (SRVENV), client in B (CLIENT prefix): one run.
sc_run() { # NAME PORT MIB CONNS SERVER-PREFIX CLIENT-PREFIX...
  name=$1; port=$2; mib=$3; nconn=$4; sp=$5; shift 5
  $sp streamcheck server --host $SRV --port $port --mib $mib --conns $nconn --pause-ms 1000 --timeout-s 30 \
    > /tmp/sc.$name.srv 2>&1 &
  spid=$!
  wait_listen A $port || bad "$name: server did not listen"
  sample_start $name
  before=$(cnt)
  timeout 40 "$@" streamcheck client --host $SRV --port $port --mib $mib --conns $nconn --pause-ms 1000 \
    --timeout-s 30 > /tmp/sc.$name.cli 2>&1
  rc=$?
  echo "    client exit $rc [t=$(uptime_s)]"
  [ $rc -eq 0 ] || last_sample $name $port
  # A server whose client never came would wait for its watchdog: 10 s.
  i=0
  while kill -0 $spid 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
  kill -0 $spid 2>/dev/null && { echo "    server still running 10 s after its client: killed"; stop $spid; }
  wait $spid
  echo "    server exit $?"
  after=$(cnt)
  sample_stop $name
  sc_verdict $name /tmp/sc.$name.srv /tmp/sc.$name.cli $nconn $mib
}

# iperf3's JSON: the "bytes" of the end section's sum_sent / sum_received.
jbytes() { # FILE KEY
  awk -v k="\"$2\"" 'index($0, k) { f = 1 } f && /"bytes":/ { gsub(/[^0-9]/, "", $2); print $2; exit }' "$1"
}

# ---------------------------------------------------------------- RDMA
step "streamcheck, shim both ends: $SC_CONNS connections, $SC_MIB MiB each way each, checksummed"
sc_run stream 7201 $SC_MIB $SC_CONNS "$SA" $SB
pay=$((SC_MIB * SC_CONNS * 1048576))
transports stream 7201 rdma A B
wire stream "$before" "$after" $pay $pay rdma

step "iperf3, shim both ends: server in A, client in B, $IPERF_BYTES B->A then A->B (-R)"
$SA iperf3 -s -B $SRV -p 7202 > /tmp/iperf.srv 2>&1 &
ipid=$!
wait_listen A 7202 || bad "iperf3: server did not listen"
for dir in fwd rev; do
  name=iperf3-$dir
  flag=; [ $dir = rev ] && flag=-R
  sample_start $name
  before=$(cnt)
  # The server may still be ending the previous test and answer "busy"
  # (iperf3 -J then exits 0); such a try moves no data: try again.
  # -b 48M: about 1.4 s of data, so the connection lives through several
  # status samples of each daemon; unpaced, 8M can move in a fraction of
  # a second and be over before daemon A's sample sees it ("no connection
  # on port 7202").
  for try in 1 2 3 4 5; do
    timeout 30 $SB iperf3 -c $SRV -p 7202 -n $IPERF_BYTES -b 48M -l 64K -J $flag > /tmp/$name.json 2>&1
    rc=$?
    grep -q 'server is busy' /tmp/$name.json || break
    echo "    server busy with the previous test, try $try"; sleep 1
  done
  echo "    client exit $rc [t=$(uptime_s)]"
  [ $rc -eq 0 ] || last_sample $name 7202
  after=$(cnt)
  sample_stop $name
  sent=$(jbytes /tmp/$name.json sum_sent); recv=$(jbytes /tmp/$name.json sum_received)
  echo "    iperf3 $dir: sender ${sent:-?} bytes, receiver ${recv:-?} bytes"
  if grep '"error"' /tmp/$name.json; then
    bad "$name data: iperf3 reported an error (exit $rc)"
  elif [ -z "$sent" ] || [ -z "$recv" ] || [ "$recv" -eq 0 ]; then
    bad "$name data: no byte counts (or 0 received)"; tail -n 5 /tmp/$name.json; recv=0
  # -R: the server sends -n and goes on writing -l blocks until it hears
  # the test end: one block on an idle machine, and on a loaded one as
  # many as the connection takes before its reader stops (the ring holds
  # RING_BYTES), as the socket buffers would on kernel TCP. The client
  # counts what it read of them until then (none, or part of one: reads
  # need not end where writes did). Every byte of -n must arrive.
  elif [ $dir = rev ] && { [ "$recv" -lt $IPERF_WANT ] || [ "$sent" -lt "$recv" ] || [ $((sent - IPERF_WANT)) -gt $((RING_BYTES + 65536)) ]; }; then
    bad "$name data: receiver $recv bytes (want all of -n = $IPERF_WANT, at most what was sent), sender $sent (want at most one ring and one 64K write more than -n)"
  elif [ "$recv" -gt "$sent" ]; then
    bad "$name data: receiver $recv bytes > sender $sent"
  else
    pass "$name data: sender $sent, receiver $recv bytes$( [ $dir = rev ] && echo ' (all of -n)')"
  fi
  transports $name 7202 rdma A B
  if [ $dir = fwd ]; then wire $name "$before" "$after" 0 $recv rdma; else wire $name "$before" "$after" $recv 0 rdma; fi
done
stop $ipid

step "sockperf ping-pong, shim both ends: $PP_SIZE B, $PP_SECS s"
$SA sockperf server --tcp -i $SRV -p 7203 > /tmp/pp.srv 2>&1 &
ppid=$!
wait_listen A 7203 || bad "sockperf: server did not listen"
sample_start pingpong
before=$(cnt)
timeout 30 $SB sockperf ping-pong --tcp -i $SRV -p 7203 -t $PP_SECS -m $PP_SIZE > /tmp/pp.cli 2>&1
rc=$?
echo "    client exit $rc [t=$(uptime_s)]"
[ $rc -eq 0 ] || last_sample pingpong 7203
after=$(cnt)
sample_stop pingpong
stop $ppid
grep -E 'Total Run|Valid Duration|dropped|percentile 50.000|avg-latency' /tmp/pp.cli | sed 's/\x1b\[[0-9;]*m//g; s/^/    /'
tot=$(sed -n 's/.*\[Total Run\].*ReceivedMessages=\([0-9]*\).*/\1/p' /tmp/pp.cli)
vs=$(sed -n 's/.*\[Valid Duration\].*SentMessages=\([0-9]*\);.*/\1/p' /tmp/pp.cli)
vr=$(sed -n 's/.*\[Valid Duration\].*ReceivedMessages=\([0-9]*\).*/\1/p' /tmp/pp.cli)
p50=$(sed -n 's/.*percentile 50.000 = *\([0-9.]*\).*/\1/p' /tmp/pp.cli)
if [ -n "$p50" ] && [ -n "$vr" ] && [ "${vr:-0}" -gt 0 ] && [ "$vs" = "$vr" ] \
   && grep -q 'dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0' /tmp/pp.cli \
   && ! grep -qi 'error' /tmp/pp.cli; then
  pass "pingpong data: $vr round trips (sent = received), none dropped, duplicated or out of order, RTT p50 $p50 usec"
else
  bad "pingpong data: no latency figures, lost messages or an error"; tail -n 8 /tmp/pp.cli | sed 's/^/    /'
fi
transports pingpong 7203 rdma A B
pp=$(( ${tot:-0} * PP_SIZE ))
wire pingpong "$before" "$after" $pp $pp rdma

step "redis-server in A, redis-benchmark and redis-cli in B, shim everywhere"
$SA redis-server --bind $SRV --port 7204 --save '' --appendonly no --protected-mode no > /tmp/redis.log 2>&1 &
rpid=$!
wait_listen A 7204 || bad "redis: server did not listen"
head -c 49152 /dev/urandom | base64 | tr -d '\n' > /tmp/val
sample_start redis
before=$(cnt)
timeout 45 $SB redis-benchmark -h $SRV -p 7204 -t set,get -n $REDIS_N -c 4 -d $REDIS_D > /tmp/rb.out 2>&1
rc=$?
echo "    redis-benchmark exit $rc [t=$(uptime_s)]"
[ $rc -eq 0 ] || last_sample redis 7204
tr '\r' '\n' < /tmp/rb.out | awk '/^====== / { t = $2 } /requests completed/ { print "    " t ": " $0 }'
done_set=$(tr '\r' '\n' < /tmp/rb.out | awk '/^====== / { t = $2 } /requests completed/ && t == "SET" { print $1 }' | tail -n 1)
done_get=$(tr '\r' '\n' < /tmp/rb.out | awk '/^====== / { t = $2 } /requests completed/ && t == "GET" { print $1 }' | tail -n 1)
stats=$(timeout 15 $SB redis-cli -h $SRV -p 7204 info commandstats 2>&1 | tr -d '\r')
calls_set=$(echo "$stats" | sed -n 's/^cmdstat_set:calls=\([0-9]*\),.*/\1/p')
calls_get=$(echo "$stats" | sed -n 's/^cmdstat_get:calls=\([0-9]*\),.*/\1/p')
echo "    server counted SET ${calls_set:-?} GET ${calls_get:-?}"
if [ "$done_set" = $REDIS_N ] && [ "$done_get" = $REDIS_N ] && [ "$calls_set" = $REDIS_N ] && [ "$calls_get" = $REDIS_N ]; then
  pass "redis data: redis-benchmark completed $REDIS_N SET and $REDIS_N GET, the server counted exactly those"
else
  bad "redis data: benchmark SET ${done_set:-?} GET ${done_get:-?}, server SET ${calls_set:-?} GET ${calls_get:-?} (want $REDIS_N each)"
  tail -n 5 /tmp/rb.out | sed 's/^/    /'; echo "$stats" | head -n 5
fi
setr=$(timeout 15 $SB redis-cli -h $SRV -p 7204 -x set rsval < /tmp/val 2>&1)
timeout 15 $SB redis-cli -h $SRV -p 7204 --raw get rsval > /tmp/got 2>&1
want=$({ cat /tmp/val; echo; } | sha256sum | cut -d' ' -f1)
got=$(sha256sum < /tmp/got | cut -d' ' -f1)
if [ "$setr" = OK ] && [ "$want" = "$got" ]; then
  pass "redis value: a $(wc -c < /tmp/val) B value SET and GET back by redis-cli, sha256 ${want%${want#????????????}}... matches"
else
  bad "redis value: SET said '$setr', GET's sha256 $got, want $want ($(wc -c < /tmp/got) B back)"
fi
# A connection that stays open a second, so the status samples (every
# 0.2 s, each two ringsock-ctl runs) also see the server's side: the
# benchmark's connections can all open and close between two samples of
# A. BLPOP on an empty list answers nil after its timeout.
t0=$(uptime_s)
blp=$(timeout 15 $SB redis-cli -h $SRV -p 7204 blpop rs:empty 1 2>&1 | tr -d '\r\n')
t1=$(uptime_s)
if { [ -z "$blp" ] || [ "$blp" = "(nil)" ]; } && awk -v a=$t0 -v b=$t1 'BEGIN { exit !(b - a >= 0.9) }'; then
  pass "redis blocking pop: BLPOP on an empty list answered nil after its 1 s timeout ($t0 -> $t1 s)"
else
  bad "redis blocking pop: BLPOP said '$blp' ($t0 -> $t1 s; want nil after at least 0.9 s)"
fi
after=$(cnt)
sample_stop redis
stop $rpid
transports redis 7204 rdma A B
wire redis "$before" "$after" $((REDIS_N * REDIS_D)) $((REDIS_N * REDIS_D)) rdma

# ---------------------------------------------------------------- zero-copy
# zc_log NAME HOST FROM: HOST's shim logged a zero-copy send after line FROM.
zc_log() {
  line=$(tail -n +$(($3 + 1)) /tmp/shim$2.log | grep 'zero-copy: first send' | head -n 1)
  if [ -n "$line" ]; then
    pass "$1 zero-copy $2: $line"
  else
    bad "$1 zero-copy $2: the shim in $2 logged no zero-copy send (path not taken); its log:"
    tail -n +$(($3 + 1)) /tmp/shim$2.log | head -n 6 | sed 's/^/    /'
  fi
}
# zc_status NAME PORT HOST...: some status sample of run NAME in HOST's
# daemon shows a connection on PORT with zc_writes > 0 and zc_bytes at
# least ZC_MIN (the counters of the end that sent zero-copy: its own
# region header, reported to its own daemon).
zc_status() {
  zname=$1; zport=$2; shift 2
  for h in "$@"; do
    expect_status "$zname status $h" --from /tmp/st.$zname.$h --port $zport \
      --counter "zc_writes>=1" --counter "zc_bytes>=$ZC_MIN" --expect "ends>=1" \
      || last_sample $zname $zport
  done
}
ZA="$SA RINGSOCK_ZEROCOPY_MIN=$ZC_MIN"
ZB="$SB RINGSOCK_ZEROCOPY_MIN=$ZC_MIN"

step "zero-copy streamcheck (RINGSOCK_ZEROCOPY_MIN=$ZC_MIN both ends): 1 connection, $ZC_MIB MiB each way"
la=$(wc -l < /tmp/shimA.log); lb=$(wc -l < /tmp/shimB.log)
sc_run zcstream 7209 $ZC_MIB 1 "$ZA" $ZB
transports zcstream 7209 rdma A B
pay=$((ZC_MIB * 1048576))
wire zcstream "$before" "$after" $pay $pay rdma
zc_log zcstream A $la
zc_log zcstream B $lb
zc_status zcstream 7209 A B

step "zero-copy buffer reuse: zcreuse client in B sends 1 MiB blocks from reused addresses, server in A checks every byte"
lb=$(wc -l < /tmp/shimB.log)
$ZA zcreuse server --host $SRV --port 7210 > /tmp/zr.srv 2>&1 &
zpid=$!
wait_listen A 7210 || bad "zcreuse: server did not listen"
sample_start zcreuse
timeout 60 $ZB zcreuse client --host $SRV --port 7210 > /tmp/zr.cli 2>&1
rc=$?
echo "    client exit $rc [t=$(uptime_s)]"
i=0
while kill -0 $zpid 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
kill -0 $zpid 2>/dev/null && { echo "    server still running 10 s after its client: killed"; stop $zpid; }
wait $zpid
srv=$?
sample_stop zcreuse
sed 's/^/    client: /' /tmp/zr.cli | tail -n 3
if [ $rc -eq 0 ] && [ $srv -eq 0 ] && grep -qx ok /tmp/zr.srv; then
  pass "zcreuse data: $(grep -c ' ok$' /tmp/zr.srv) blocks, every byte right ($(grep same-address /tmp/zr.cli))"
else
  bad "zcreuse data: client exit $rc, server exit $srv: $(grep FAIL /tmp/zr.srv /tmp/zr.cli | head -n 2 | tr '\n' ' ')"
  tail -n 3 /tmp/zr.srv | sed 's/^/    server: /'
fi
if grep -q 'same-address 0 ' /tmp/zr.cli; then
  bad "zcreuse precondition: no reused block had the same address: the check proves nothing"
fi
transports zcreuse 7210 rdma A B
zc_log zcreuse B $lb
zc_status zcreuse 7210 B

# ---------------------------------------------------------------- fallbacks
step "fallback: shimmed client in B, streamcheck server in A without the shim"
sc_run plainsrv 7205 $FB_MIB 1 "$PA" $SB
transports plainsrv 7205 tcp B
pay=$((FB_MIB * 1048576))
wire plainsrv "$before" "$after" $pay $pay tcp

# -b 32M: about 2 s, so that the status samples see the connection.
step "fallback: shimmed iperf3 client in B, iperf3 server in A without the shim ($IPERF_BYTES at 32 Mbit/s, -R)"
$PA iperf3 -s -1 -B $SRV -p 7206 > /tmp/iperf-plain.srv 2>&1 &
ipid=$!
wait_listen A 7206 || bad "plain iperf3: server did not listen"
sample_start iperf3-plain
before=$(cnt)
timeout 30 $SB iperf3 -c $SRV -p 7206 -n $IPERF_BYTES -b 32M -l 64K -J -R > /tmp/iperf3-plain.json 2>&1
echo "    client exit $?"
after=$(cnt)
sample_stop iperf3-plain
stop $ipid
sent=$(jbytes /tmp/iperf3-plain.json sum_sent); recv=$(jbytes /tmp/iperf3-plain.json sum_received)
if ! grep -q '"error"' /tmp/iperf3-plain.json && [ -n "$recv" ] && [ "$recv" -gt 0 ] && [ "$sent" = "$recv" ]; then
  pass "iperf3-plain data: sender $sent = receiver $recv bytes"
else
  bad "iperf3-plain data: sender ${sent:-?}, receiver ${recv:-?} bytes"; grep '"error"' /tmp/iperf3-plain.json; recv=0
fi
transports iperf3-plain 7206 tcp B
wire iperf3-plain "$before" "$after" ${recv:-0} 0 tcp

step "locked memory: a client without CAP_IPC_LOCK and RLIMIT_MEMLOCK $MEMLOCK_KB KiB"
# Root ignores RLIMIT_MEMLOCK through CAP_IPC_LOCK: drop it from the
# inheritable and bounding sets, so the program exec'd below has it nowhere.
NOLOCK="/opt/ringsock/setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock"
if [ -x /opt/ringsock/setpriv ]; then
  $IP netns exec B $NOLOCK sh -c "ulimit -l $MEMLOCK_KB; echo \"    under the limit: \$(grep CapEff /proc/self/status), ulimit -l \$(ulimit -l)\""
  # Precondition: the verbs library alone cannot register a ring there.
  $A verbscheck serve --listen $SRV:7207 > /tmp/vs.srv 2>&1 &
  vpid=$!
  wait_listen A 7207
  timeout 30 $IP netns exec B $NOLOCK sh -c "ulimit -l $MEMLOCK_KB; exec env RINGSOCK_DEVICE=rxeB verbscheck stream --connect $SRV:7207 --mib 1" > /tmp/vs.cli 2>&1
  vrc=$?
  stop $vpid
  sed 's/^/    verbscheck: /' /tmp/vs.cli | tail -n 3
  if [ $vrc -ne 0 ] && ! grep -q ' ok=1' /tmp/vs.cli; then
    pass "memlock precondition: verbscheck cannot set a verbs ring up under the limit (exit $vrc)"
  else
    bad "memlock precondition: verbscheck ran a verbs ring under the limit: the limit is not reproduced"
  fi
  l0=$(wc -l < /tmp/shimB.log)
  sc_run memlock 7208 $FB_MIB 1 "$SA" $IP netns exec B $NOLOCK sh -c \
    "ulimit -l $MEMLOCK_KB; exec env RINGSOCK_DEVICE=rxeB RINGSOCK_CTL_SOCK=/tmp/ctlB.sock RINGSOCK_LOG_FILE=/tmp/shimB.log $SHIMENV \"\$0\" \"\$@\""
  transports memlock 7208 tcp A B
  pay=$((FB_MIB * 1048576))
  wire memlock "$before" "$after" $pay $pay tcp
  tail -n +$((l0 + 1)) /tmp/shimB.log > /tmp/shimB.memlock
  line=$(grep -i 'memlock\|locked memory\|lock memory' /tmp/shimB.memlock | head -n 1)
  if [ -n "$line" ]; then
    pass "memlock log: $line"
  else
    bad "memlock log: no shim log line in B names the locked-memory limit; its log during the run:"
    head -n 8 /tmp/shimB.memlock | sed 's/^/    /'
  fi
else
  bad "memlock: no setpriv in the guest (pass /usr/bin/setpriv to scripts/softroce-vm)"
fi

# ---------------------------------------------------------------- outage
# The RDMA wire goes down mid-stream. Shorter than the queue pairs retry
# (7 tries of 268 ms), the stream rides it out on the ring; longer, kernel
# TCP would still ride it out, so the connection must too, leaving the
# ring for its kernel socket (on the ctl wire) at offsets both ends agree
# on. Either way every byte arrives once and in order, and nothing hangs.
outage() { # NAME PORT SECS
  name=$1; port=$2; secs=$3
  step "RDMA wire outage: streamcheck, shim both ends, 1 connection, $OUT_MIB MiB each way, vethB down $secs s mid-stream"
  gone0=$(cat /tmp/shimA.log /tmp/shimB.log | grep -c "goes on over TCP")
  $SA streamcheck server --host $SRV --port $port --mib $OUT_MIB --conns 1 --timeout-s 90 \
    > /tmp/sc.$name.srv 2>&1 &
  spid=$!
  wait_listen A $port || bad "$name: server did not listen"
  (
    # Once the connection is on the ring and moving bytes, cut the wire.
    i=0
    while [ $i -lt 200 ]; do
      ringsock-ctl status --socket /tmp/ctlA.sock 2>/dev/null | grep ":$port " | grep -q "rdma.*in_bytes=[1-9]" && break
      sleep 0.1; i=$((i + 1))
    done
    $IP link set vethB down
    echo "    vethB down [t=$(uptime_s)]"
    sleep $secs
    $IP link set vethB up
    echo "    vethB up [t=$(uptime_s)]"
  ) &
  cutpid=$!
  timeout 120 $SB streamcheck client --host $SRV --port $port --mib $OUT_MIB --conns 1 --timeout-s 90 \
    > /tmp/sc.$name.cli 2>&1
  echo "    client exit $? [t=$(uptime_s)]"
  wait $cutpid
  i=0
  while kill -0 $spid 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
  kill -0 $spid 2>/dev/null && { echo "    server still running 10 s after its client: killed"; stop $spid; }
  wait $spid
  echo "    server exit $?"
  sc_verdict $name /tmp/sc.$name.srv /tmp/sc.$name.cli 1 $OUT_MIB
  gone=$(($(cat /tmp/shimA.log /tmp/shimB.log | grep -c "goes on over TCP") - gone0))
  echo "    $gone log lines of ends that left the ring for TCP"
  grep -h "goes on over TCP\|wire failed\|cannot be left" /tmp/shimA.log /tmp/shimB.log | tail -n 4 | sed 's/^/    /'
}

outage outage-short 7211 $OUT_SHORT_SECS
outage outage 7210 $OUT_SECS
if [ $gone -ge 2 ]; then
  pass "outage leave: both ends left the ring for TCP ($gone log lines)"
else
  bad "outage leave: $gone of 2 ends logged leaving the ring for TCP"
fi

# ---------------------------------------------------------------- late answer
# The server's process is stopped while the client's wire fails: the
# client's LOST header waits longer than its connect timeout (2 s here)
# for an answer. As TCP waits for a stalled peer, the connection waits for
# the answer on the kernel socket, the client's sends and reads held back
# meanwhile; the server, continued, answers, and the stream goes on whole.
# (Where the client posted nothing while the wire was down, its queue
# pair holds and the stream never leaves the ring.)
step "late LOST answer: server stopped 6 s, vethB down 1 s, connect timeout 2 s"
LATE="RINGSOCK_CONNECT_TIMEOUT_MS=2000"
$SA $LATE streamcheck server --host $SRV --port 7212 --mib $OUT_MIB --conns 1 --timeout-s 40 \
  > /tmp/sc.late.srv 2>&1 &
spid=$!
wait_listen A 7212 || bad "late: server did not listen"
(
  i=0
  while [ $i -lt 200 ]; do
    ringsock-ctl status --socket /tmp/ctlA.sock 2>/dev/null | grep ":7212 " | grep -q "rdma.*in_bytes=[1-9]" && break
    sleep 0.1; i=$((i + 1))
  done
  kill -STOP $spid
  $IP link set vethB down
  sleep 1
  $IP link set vethB up
  sleep 5
  kill -CONT $spid
) &
cutpid=$!
late0=$(grep -c "answered our leave late" /tmp/shimB.log)
timeout 60 $SB $LATE streamcheck client --host $SRV --port 7212 --mib $OUT_MIB --conns 1 --timeout-s 40 \
  > /tmp/sc.late.cli 2>&1
wait $cutpid
i=0
while kill -0 $spid 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
stop $spid
late=$(($(grep -c "answered our leave late" /tmp/shimB.log) - late0))
echo "    $late log lines of a late answer in B"
grep -h "answered our leave late\|waits for it on TCP\|cannot be left" /tmp/shimB.log | tail -n 3 | sed 's/^/    /'
if grep -q "wrong bytes\|after a peek of [0-9]* returned [1-9]" /tmp/sc.late.srv /tmp/sc.late.cli; then
  bad "late answer: a program read bytes that are not the stream's"
else
  sc_verdict late /tmp/sc.late.srv /tmp/sc.late.cli 1 $OUT_MIB
fi

# ---------------------------------------------------------------- end
step "logs"
for h in A B; do
  echo "--- ctl $h (last 6 lines)"; tail -n 6 /tmp/ctl$h.log
  echo "--- shim $h: $(wc -l < /tmp/shim$h.log) lines, last 6:"; tail -n 6 /tmp/shim$h.log
done
stop $ctlpidA $ctlpidB
t1=$(cut -d' ' -f1 /proc/uptime)
echo "GUEST-SECONDS from=$t0 to=$t1"
echo "SHIM-CHECK $npass passed, $nfail failed"
[ $fail -eq 0 ] && echo "SHIM-CHECK PASSED" || echo "SHIM-CHECK FAILED"
exit $fail
