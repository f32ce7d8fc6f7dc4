# Guest script for scripts/softroce-vm (busybox sh, run as /guest.sh), used
# by scripts/bench-softroce: unmodified sockperf and iperf3 on kernel TCP,
# under ringsock (libringsock.so + a ringsock-ctl daemon) and under
# rsocket's preload, all inside one guest with one rxe device, alternating
# the three systems run by run. Prints one machine-readable line per run:
#   ROW <workload> <system> <rep> <value> <unit> <transport-check>
# and exits 0 only if every run produced a number (a system that cannot
# run a program prints value FAIL, which counts as a finding, not an error).
#
# Both ends are in one guest, so ringsock uses its shared-memory ring there
# (same host); rsocket needs the RDMA device and runs over rxe. Under TCG
# only ratios within one run mean anything.
#
# Knobs (the kernel command line cannot pass them; edit here).
REPS=3
SECS=3
# sockperf refuses messages over 65507 B: its "64 KiB" is 65000 B.
PP_SIZES="64 4096 65000"
RAW_SIZES=64,4096,65536
RAW_ITERS=300
RAW_MIB=4
TP_SIZES="64 1400"
RSPRELOAD=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
SHIM=/opt/ringsock/libringsock.so
SRV=10.0.0.1

IP=/usr/sbin/ip; [ -x $IP ] || IP=/sbin/ip
RDMA=/usr/bin/rdma; [ -x $RDMA ] || RDMA=/usr/sbin/rdma

$IP link add rsdummy0 type dummy && $IP addr add $SRV/24 dev rsdummy0 \
  && $IP link set rsdummy0 up && $RDMA link add rxe0 type rxe netdev rsdummy0 \
  || { echo "rxe0 setup failed"; exit 3; }
sleep 1

ringsock-ctl daemon --socket /tmp/ctl.sock --foreground > /tmp/ctl.log 2>&1 &
ctlpid=$!
sleep 1

# env prefix for each system
sysenv() {
  case $1 in
    kernel) echo "env" ;;
    ringsock) echo "env LD_PRELOAD=$SHIM RINGSOCK_CTL_SOCK=/tmp/ctl.sock" ;;
    rsocket) echo "env LD_PRELOAD=$RSPRELOAD" ;;
  esac
}

# What carried the connection: for ringsock, the transports the daemon
# saw mid-run; for the others, the name of the system.
check_mid_run() { # SYSTEM
  if [ "$1" = ringsock ]; then
    st=$(ringsock-ctl status --json --socket /tmp/ctl.sock 2>&1)
    shm=$(echo "$st" | grep -o '"transport":"shm"' | wc -l)
    tcp=$(echo "$st" | grep -o '"transport":"tcp"' | wc -l)
    echo "shm=$shm,tcp=$tcp"
  else
    echo "-"
  fi
}

port=7100
next_port() { port=$((port + 1)); }

start_server() { # SYSTEM CMD...
  s=$1; shift
  $(sysenv $s) "$@" > /tmp/server.log 2>&1 &
  srvpid=$!
  sleep 1
}

stop_server() {
  kill $srvpid 2>/dev/null
  sleep 0.2
  kill -9 $srvpid 2>/dev/null
  wait $srvpid 2>/dev/null
}

pingpong() { # SYSTEM SIZE REP
  next_port
  start_server $1 sockperf server --tcp -i $SRV -p $port
  ( sleep $((SECS / 2 + 1)); check_mid_run $1 > /tmp/check ) &
  chkpid=$!
  out=$(timeout $((SECS + 30)) $(sysenv $1) sockperf ping-pong --tcp -i $SRV -p $port -t $SECS -m $2 --full-rtt 2>&1)
  wait $chkpid
  v=$(echo "$out" | sed -n 's/.*percentile 50.000 = *\([0-9.]*\).*/\1/p' | head -n 1)
  [ -n "$v" ] || { v=FAIL; echo "$out" | tail -n 3; }
  echo "ROW pingpong-$2 $1 $3 $v usec $(cat /tmp/check)"
  stop_server
}

throughput() { # SYSTEM SIZE REP
  next_port
  start_server $1 sockperf server --tcp -i $SRV -p $port
  ( sleep $((SECS / 2 + 1)); check_mid_run $1 > /tmp/check ) &
  chkpid=$!
  out=$(timeout $((SECS + 30)) $(sysenv $1) sockperf throughput --tcp -i $SRV -p $port -t $SECS -m $2 2>&1)
  wait $chkpid
  v=$(echo "$out" | sed -n 's/.*Message Rate is \([0-9.]*\).*/\1/p' | head -n 1)
  [ -n "$v" ] || { v=FAIL; echo "$out" | tail -n 3; }
  echo "ROW throughput-$2 $1 $3 $v msg/s $(cat /tmp/check)"
  stop_server
}

iperf() { # SYSTEM REP
  next_port
  start_server $1 iperf3 -s -B $SRV -p $port
  ( sleep $((SECS / 2 + 1)); check_mid_run $1 > /tmp/check ) &
  chkpid=$!
  out=$(timeout $((SECS + 30)) $(sysenv $1) iperf3 -c $SRV -p $port -t $SECS 2>&1)
  wait $chkpid
  # The receiver's line: what arrived, not what was queued.
  v=$(echo "$out" | grep 'receiver' | tail -n 1 | awk '{for (i = 1; i < NF; i++) if ($(i+1) ~ /bits\/sec/) {print $i " " $(i+1)}}')
  case "$v" in
    *Gbits/sec) v=$(echo "$v" | awk '{print $1 * 1000}') ;;
    *Mbits/sec) v=$(echo "$v" | awk '{print $1}') ;;
    *Kbits/sec) v=$(echo "$v" | awk '{print $1 / 1000}') ;;
    *) v="" ;;
  esac
  # 0 bits received is a failure of the system, not a measurement.
  case "$v" in ""|0|0.0|0.00) v=FAIL; echo "$out" | tail -n 4 ;; esac
  echo "ROW iperf3 $1 $2 $v Mbit/s $(cat /tmp/check)"
  stop_server
}

# verbscheck's raw-socket ping-pong and bulk test (plain send/recv, the
# calls rsocket's preload supports): under kernel, ringsock and rsocket;
# "verbs" is ringsock's verbs ring itself (the library over rxe0, no shim,
# no socket calls), for reference.
raw() { # SYSTEM REP
  next_port
  if [ $1 = verbs ]; then
    env RINGSOCK_DEVICE=rxe0 verbscheck serve --listen $SRV:$port > /tmp/server.log 2>&1 &
    srvpid=$!; sleep 1
    out=$(timeout 120 env RINGSOCK_DEVICE=rxe0 verbscheck pingpong --connect $SRV:$port \
      --sizes $RAW_SIZES --iters $RAW_ITERS --bw-mib $RAW_MIB --reps 1 2>&1)
    chk="-"
  else
    start_server $1 verbscheck tcp-serve --listen $SRV:$port
    # verbscheck opens one short connection per size and test: sample
    # status every 0.2 s while it runs and keep the sample with the most
    # connections.
    ( best=-; bestn=0; i=0
      while [ $i -lt 40 ]; do
        c=$(check_mid_run $1)
        n=$(echo "$c" | sed -n 's/shm=\([0-9]*\),tcp=\([0-9]*\)/\1 \2/p' | awk '{print $1 + $2}')
        if [ -n "$n" ] && [ "$n" -gt "$bestn" ]; then best=$c; bestn=$n; fi
        echo "$best" > /tmp/check
        sleep 0.2; i=$((i + 1))
      done ) &
    chkpid=$!
    out=$(timeout 120 $(sysenv $1) verbscheck pingpong --tcp --connect $SRV:$port \
      --sizes $RAW_SIZES --iters $RAW_ITERS --bw-mib $RAW_MIB --reps 1 2>&1)
    kill $chkpid 2>/dev/null; wait $chkpid 2>/dev/null
    chk=$(cat /tmp/check)
  fi
  for size in $(echo $RAW_SIZES | tr , ' '); do
    v=$(echo "$out" | sed -n "s/.*test=pingpong size=$size .*rtt_med_us=\([0-9.]*\).*/\1/p" | head -n 1)
    [ -n "$v" ] || v=FAIL
    echo "ROW rawpp-$size $1 $2 $v usec $chk"
    v=$(echo "$out" | sed -n "s/.*test=bw size=$size .*mbps_med=\([0-9.]*\).*/\1/p" | head -n 1)
    [ -n "$v" ] || v=FAIL
    echo "ROW rawbw-$size $1 $2 $v MB/s $chk"
  done
  echo "$out" | grep -q RESULT || echo "$out" | tail -n 3
  stop_server
}

echo "GUEST cpus=$(grep -c ^processor /proc/cpuinfo) kernel=$(uname -r)"
rep=1
while [ $rep -le $REPS ]; do
  for size in $PP_SIZES; do
    for s in kernel ringsock rsocket; do pingpong $s $size $rep; done
  done
  for size in $TP_SIZES; do
    for s in kernel ringsock rsocket; do throughput $s $size $rep; done
  done
  for s in kernel ringsock rsocket; do iperf $s $rep; done
  for s in kernel ringsock rsocket verbs; do raw $s $rep; done
  rep=$((rep + 1))
done

kill $ctlpid 2>/dev/null
wait $ctlpid 2>/dev/null
exit 0
