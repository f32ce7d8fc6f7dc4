# Guest script for scripts/softroce-vm (busybox sh, run as /guest.sh), used
# by scripts/bench-softroce: unmodified sockperf and iperf3, and
# verbscheck's raw send/recv test, on three systems in one guest (and,
# for the raw test, three references), alternating them run by run:
#   kernel    kernel TCP between hosts A and B (namespaces, twohosts.sh),
#             over the ctlA<->ctlB veth wire;
#   ringsock  the same programs under libringsock.so between A and B, a
#             ringsock-ctl daemon in each host: RDMA verbs over rxeA/rxeB
#             and the vethA<->vethB wire;
#   rsocket   the same programs under rsocket's preload, both ends in the
#             root namespace (rsocket resolves addresses with rdma_cm in
#             the caller's namespace, where namespaces A and B have no rxe
#             netdev), the client bound to vethB's address 10.9.0.2 and
#             the server on vethA's 10.9.0.1: rdma_cm then puts the client
#             on rxeB and the server on rxeA, and the packets cross the
#             vethA<->vethB wire as ringsock's do (its check column counts
#             rxeB's sent packets: 0 would mean it ran over loopback);
#   rsocket-poll  (raw test only) rsocket's preload as above, its polling
#             time (/etc/rdma/rsocket/polling_time, default 10 us) set to
#             SHIM_SPIN_US: the like-for-like reference for the ringsock
#             runs, whose spin budget is scaled the same way;
#   rsocket-lo  (raw test only) rsocket's preload with both ends on rxeA
#             (rxe loopback: no IP stack and no wire, about 3x cheaper per
#             message than the wire here), for reference;
#   perftest  (raw bulk only) ib_write_bw A<->B: the device's own ceiling
#             for one-sided WRITEs of that size, for reference;
#   ringsock-spin50  (raw test only) the shim at its default spin budget
#             (50 us; the ringsock runs use SHIM_SPIN_US below);
#   verbs     (raw test only) ringsock's verbs ring library itself between
#             A and B, no shim and no socket calls, for reference (both
#             ends spin verbscheck's default 2 ms before they sleep).
# Prints one machine-readable line per run:
#   ROW <workload> <system> <rep> <value> <unit> <transport-check>
# where the check is, for ringsock, the transports both daemons reported
# for the run's connections ("rdma=N,tcp=M,shm=K"; anything but rdma means
# the run did not measure the verbs ring), and for rsocket the packets
# rxeB sent during the run ("rxeB_sent=N"). A system that cannot run a
# program prints value FAIL (a finding, not an error) and is not tried
# again on that workload in later repetitions (SKIP). Exit 0 unless the
# setup failed. Under TCG only ratios within one run mean anything.
#
# Knobs (the kernel command line cannot pass them; edit here).
REPS=3
SECS=3
# sockperf refuses messages over 65507 B: its "64 KiB" is 65000 B.
PP_SIZES="64 4096 65000"
IPERF_SIZES="64 4096 65536"
RAW_SIZES=64,4096,65536
RAW_ITERS=300
RAW_MIB=4
RSPRELOAD=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
# The shim's spin budget before it sleeps. Its default (50 us) is sized for
# an RDMA NIC, whose round trip is a few microseconds; through rxe under
# TCG one takes about 0.6 ms, so at 50 us nearly every message would pay
# a sleep, a kick and a wake-up through the completion channel. The
# budget is scaled like the round trip.
SHIM_SPIN_US=20000
# The transport check samples both daemons' status while a ringsock run
# goes on (shimhosts.sh). At the 0.2 s the functional checks use, the
# sampler's ringsock-ctl processes take a share of the guest's CPU and
# slow whatever runs beside them. So the runs of the other systems are
# not sampled at all (their checks need no daemon), and ringsock's once a
# second: its own runs bear what is left of that cost.
SAMPLE_SECS=1

. /guest.d/twohosts.sh
. /guest.d/shimhosts.sh
# Benchmarks log warnings only.
SA50=$(echo "$SA" | sed "s/RINGSOCK_LOG=info/RINGSOCK_LOG=warn/")
SB50=$(echo "$SB" | sed "s/RINGSOCK_LOG=info/RINGSOCK_LOG=warn/")
SA=$(echo "$SA" | sed "s/RINGSOCK_LOG=info/RINGSOCK_LOG=warn RINGSOCK_SPIN_US=$SHIM_SPIN_US/")
SB=$(echo "$SB" | sed "s/RINGSOCK_LOG=info/RINGSOCK_LOG=warn RINGSOCK_SPIN_US=$SHIM_SPIN_US/")

# server and client prefixes, and the server address, per system
srvenv() {
  case $1 in
    kernel) echo "$PA" ;;
    ringsock) echo "$SA" ;;
    ringsock-spin50) echo "$SA50" ;;
    rsocket*) echo "env LD_PRELOAD=$RSPRELOAD" ;;
  esac
}
clienv() {
  case $1 in
    kernel) echo "$PB" ;;
    ringsock) echo "$SB" ;;
    ringsock-spin50) echo "$SB50" ;;
    rsocket*) echo "env LD_PRELOAD=$RSPRELOAD" ;;
  esac
}
srvaddr() { case $1 in rsocket*) echo 10.9.0.1 ;; *) echo $SRV ;; esac; }
srvhost() { case $1 in rsocket*) echo root ;; *) echo A ;; esac; }
# rsocket's polling time (µs) before it blocks (rsocket(7)); rsocket-poll
# writes it, nothing else may find it there.
RS_POLLING=/etc/rdma/rsocket/polling_time
mkdir -p /etc/rdma/rsocket
rm -f $RS_POLLING
# The rsocket client's source address (see the header); empty otherwise.
RS_SRC=10.9.0.2
rxeb_sent() { cat /sys/class/infiniband/rxeB/ports/1/hw_counters/sent_pkts 2>/dev/null || echo 0; }

port=7100
next_port() { port=$((port + 1)); }

# A system that failed a workload is not tried on it again.
failed() { [ -e /tmp/failed.$1.$2 ]; }
mark_failed() { touch /tmp/failed.$1.$2; }

start_server() { # SYSTEM CMD...
  s=$1; shift
  $(srvenv $s) "$@" > /tmp/server.log 2>&1 &
  srvpid=$!
  if [ $(srvhost $s) = root ]; then sleep 1; else wait_listen A $port > /dev/null; fi
}

# The status sampler runs for ringsock's runs only (see SAMPLE_SECS).
measure_start() { # SYSTEM NAME
  case $1 in ringsock*) sample_start $2 ;; esac
}
measure_stop() { # SYSTEM NAME
  case $1 in ringsock*) sample_stop $2 ;; esac
}

check_of() { # SYSTEM NAME
  case $1 in
    ringsock*) tally $2 $port ;;
    rsocket|rsocket-poll) echo "rxeB_sent=$(($(rxeb_sent) - rs_sent0))" ;;
    *) echo "-" ;;
  esac
}
rs_sent0=0

pingpong() { # SYSTEM SIZE REP
  w=pingpong-$2
  if failed $w $1; then echo "ROW $w $1 $3 SKIP usec -"; return; fi
  next_port
  start_server $1 sockperf server --tcp -i $(srvaddr $1) -p $port
  measure_start $1 $w
  src=; [ $1 = rsocket ] && src="--client_ip $RS_SRC"
  rs_sent0=$(rxeb_sent)
  out=$(timeout $((SECS + 30)) $(clienv $1) sockperf ping-pong --tcp -i $(srvaddr $1) -p $port -t $SECS -m $2 --full-rtt $src 2>&1)
  measure_stop $1 $w
  v=$(echo "$out" | sed -n 's/.*percentile 50.000 = *\([0-9.]*\).*/\1/p' | head -n 1)
  [ -n "$v" ] || { v=FAIL; mark_failed $w $1; echo "$out" | tail -n 3; }
  echo "ROW $w $1 $3 $v usec $(check_of $1 $w)"
  stop $srvpid
}

iperf() { # SYSTEM SIZE REP
  w=iperf3-$2
  if failed $w $1; then echo "ROW $w $1 $3 SKIP Mbit/s -"; return; fi
  next_port
  start_server $1 iperf3 -s -B $(srvaddr $1) -p $port
  measure_start $1 $w
  src=; [ $1 = rsocket ] && src="-B $RS_SRC"
  rs_sent0=$(rxeb_sent)
  timeout $((SECS + 30)) $(clienv $1) iperf3 -c $(srvaddr $1) -p $port -t $SECS -l $2 -J $src > /tmp/iperf.json 2>&1
  measure_stop $1 $w
  # The receiver's rate: what arrived, not what was queued.
  v=$(awk 'index($0, "\"sum_received\"") { f = 1 } f && /"bits_per_second":/ { gsub(/[^0-9.]/, "", $2); printf "%.2f\n", $2 / 1e6; exit }' /tmp/iperf.json)
  # No rate, an error, or 0 bits received is a failure of the system, not
  # a measurement.
  if [ -z "$v" ] || grep -q '"error"' /tmp/iperf.json || [ "$v" = 0.00 ]; then
    grep '"error"' /tmp/iperf.json | head -n 1
    v=FAIL; mark_failed $w $1
  fi
  echo "ROW $w $1 $3 $v Mbit/s $(check_of $1 $w)"
  stop $srvpid
}

# verbscheck's raw-socket ping-pong and bulk test (plain send/recv, the
# calls rsocket's preload supports), and the verbs ring library itself.
raw() { # SYSTEM REP
  next_port
  w=raw
  if [ $1 = verbs ]; then
    $A verbscheck serve --listen $SRV:$port > /tmp/server.log 2>&1 &
    srvpid=$!
    wait_listen A $port > /dev/null
    out=$(timeout 150 $B verbscheck pingpong --connect $SRV:$port \
      --sizes $RAW_SIZES --iters $RAW_ITERS --bw-mib $RAW_MIB --reps 1 2>&1)
    chk="-"
  else
    # rsocket reads its polling time once per process, at its first call:
    # the file is there before the server starts.
    [ $1 = rsocket-poll ] && echo $SHIM_SPIN_US > $RS_POLLING
    start_server $1 verbscheck tcp-serve --listen $(srvaddr $1):$port
    measure_start $1 $w
    src=; case $1 in rsocket|rsocket-poll) src="--bind $RS_SRC" ;; esac
    rs_sent0=$(rxeb_sent)
    out=$(timeout 150 $(clienv $1) verbscheck pingpong --tcp --connect $(srvaddr $1):$port \
      --sizes $RAW_SIZES --iters $RAW_ITERS --bw-mib $RAW_MIB --reps 1 $src 2>&1)
    measure_stop $1 $w
    chk=$(check_of $1 $w)
    rm -f $RS_POLLING
  fi
  nf=0
  for size in $(echo $RAW_SIZES | tr , ' '); do
    v=$(echo "$out" | sed -n "s/.*test=pingpong size=$size .*rtt_med_us=\([0-9.]*\).*/\1/p" | head -n 1)
    [ -n "$v" ] || { v=FAIL; nf=1; }
    echo "ROW rawpp-$size $1 $2 $v usec $chk"
    v=$(echo "$out" | sed -n "s/.*test=bw size=$size .*mbps_med=\([0-9.]*\).*/\1/p" | head -n 1)
    [ -n "$v" ] || { v=FAIL; nf=1; }
    echo "ROW rawbw-$size $1 $2 $v MB/s $chk"
  done
  [ $nf = 0 ] || echo "$out" | grep -v RESULT | tail -n 3
  stop $srvpid
}

# ib_write_bw A<->B at SIZE: one-sided WRITEs straight from perftest, the
# device's ceiling for the raw bulk rows (Gb/s converted to MB/s).
devbw() { # SIZE REP
  next_port
  n=$((4 * 1048576 / $1)); [ $n -lt 200 ] && n=200; [ $n -gt 20000 ] && n=20000
  $IP netns exec A timeout 120 ib_write_bw -d rxeA -x $gidA -p $port -s $1 -n $n --report_gbits > /tmp/bw_srv.log 2>&1 &
  bwpid=$!
  sleep 1
  out=$($IP netns exec B timeout 120 ib_write_bw -d rxeB -x $gidB -p $port -s $1 -n $n --report_gbits $SRV 2>&1)
  wait $bwpid 2>/dev/null
  v=$(echo "$out" | awk -v s=$1 '$1 == s && NF >= 4 { printf "%.1f\n", $4 * 125; exit }')
  [ -n "$v" ] || { v=FAIL; echo "$out" | tail -n 3; }
  echo "ROW rawbw-$1 perftest $2 $v MB/s -"
}
gidA=$($A verbscheck info | sed -n 's/.*gid_index=\([0-9]*\).*/\1/p')
gidB=$($B verbscheck info | sed -n 's/.*gid_index=\([0-9]*\).*/\1/p')

echo "GUEST cpus=$(grep -c ^processor /proc/cpuinfo) kernel=$(uname -r) topology=A<->B(ringsock,kernel,rsocket:rxeB->rxeA),root-rxeA-loopback(rsocket-lo)"
rep=1
while [ $rep -le $REPS ]; do
  step "repetition $rep"
  for size in $PP_SIZES; do
    for s in kernel ringsock rsocket; do pingpong $s $size $rep; done
  done
  for size in $IPERF_SIZES; do
    for s in kernel ringsock rsocket; do iperf $s $size $rep; done
  done
  for s in kernel ringsock ringsock-spin50 rsocket rsocket-poll rsocket-lo verbs; do raw $s $rep; done
  for size in $(echo $RAW_SIZES | tr , ' '); do devbw $size $rep; done
  rep=$((rep + 1))
done

step "shim logs (warnings)"
tail -n 5 /tmp/shimA.log /tmp/shimB.log
stop $ctlpidA $ctlpidB
exit 0
