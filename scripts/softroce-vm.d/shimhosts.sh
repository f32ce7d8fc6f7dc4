# Sourced by the guest scripts that run the shim between hosts A and B
# (shim.sh, programs.sh; after twohosts.sh): a ringsock-ctl daemon in each
# host, the shim's environment for each ($SA, $SB; $PA, $PB run the same
# hosts without it), and the helpers that sample and read both daemons'
# status.
SHIM=/opt/ringsock/libringsock.so

# Generous bounds everywhere: under TCG a ring set up between two daemons
# takes far longer than on hardware. The shim waits up to 15 s for its
# daemon (which waits up to 10 s for the other host's), and a client waits
# 5 s for the server to take its ring.
SHIMENV="LD_PRELOAD=$SHIM RINGSOCK_CONNECT_TIMEOUT_MS=15000 RINGSOCK_CLAIM_WAIT_MS=5000 RINGSOCK_LOG=info"
SA="$A RINGSOCK_CTL_SOCK=/tmp/ctlA.sock RINGSOCK_LOG_FILE=/tmp/shimA.log $SHIMENV"
SB="$B RINGSOCK_CTL_SOCK=/tmp/ctlB.sock RINGSOCK_LOG_FILE=/tmp/shimB.log $SHIMENV"
# The same hosts without the shim.
PA="$A"
PB="$B"
: > /tmp/shimA.log
: > /tmp/shimB.log

step "ringsock-ctl daemons in A and B (peer port 7471 on the ctl wire)"
for h in A B; do
  $IP netns exec $h ringsock-ctl daemon --socket /tmp/ctl$h.sock --foreground --log-level info \
    --peer-timeout-ms 10000 --peer-retry-ms 1000 > /tmp/ctl$h.log 2>&1 &
  eval ctlpid$h=$!
done

# wait_listen HOST PORT: until something listens on TCP PORT in HOST (no
# connection made: a probe would show in the status samples).
wait_listen() {
  i=0
  while [ $i -lt 100 ]; do
    $IP netns exec $1 netstat -ltn 2>/dev/null | grep -q ":$2 " && return 0
    sleep 0.1; i=$((i + 1))
  done
  echo "nothing listens on $1:$2 after 10 s"
  return 1
}
for h in A B; do
  if wait_listen $h 7471 && ringsock-ctl status --socket /tmp/ctl$h.sock > /dev/null 2>&1; then
    echo "daemon $h up"
  else
    echo "SETUP FAILED: ringsock-ctl daemon in $h"; cat /tmp/ctl$h.log; exit 3
  fi
done

stop() { # PID...: ends a server and reaps it
  kill "$@" 2>/dev/null
  sleep 0.2
  kill -9 "$@" 2>/dev/null
  wait "$@" 2>/dev/null
}

# Status sampling: both daemons every SAMPLE_SECS (default 0.2 s) into
# /tmp/st.NAME.{A,B}, one `ringsock-ctl status --json` listing per line
# (what a failed sample said goes to /tmp/st.NAME.{A,B}.err). Each sample
# starts two ringsock-ctl processes: at 0.2 s they take a share of the
# guest's CPU that slows a bulk run, so benchmarks sample less often
# (programs.sh). The samples are read back by `ringsock-ctl status
# --from` (ctl/README.md): no JSON is parsed in shell.
SAMPLE_SECS=${SAMPLE_SECS:-0.2}
sample_one() { # NAME HOST
  ringsock-ctl status --json --socket /tmp/ctl$2.sock >> /tmp/st.$1.$2 2>> /tmp/st.$1.$2.err
}
sample_start() { # NAME
  rm -f /tmp/st.$1.A /tmp/st.$1.B /tmp/st.$1.A.err /tmp/st.$1.B.err
  ( while :; do
      for h in A B; do sample_one $1 $h; done
      sleep $SAMPLE_SECS
    done ) &
  smppid=$!
}
sample_stop() { # NAME: one last sample, then the sampler ends
  kill $smppid 2>/dev/null
  wait $smppid 2>/dev/null
  for h in A B; do sample_one $1 $h; done
}

# expect_status LABEL ARGS...: `ringsock-ctl status ARGS` (a check with
# --expect) as one pass or bad line with its verdict, then the connection
# ends it names; returns 1 if the check failed.
expect_status() {
  label=$1; shift
  if ringsock-ctl status "$@" > /tmp/expect.out 2> /tmp/expect.err; then
    pass "$label: $(head -n 1 /tmp/expect.out)"; rc=0
  else
    bad "$label: $(head -n 1 /tmp/expect.out)$(head -n 1 /tmp/expect.err)"; rc=1
  fi
  tail -n +2 /tmp/expect.out | sed 's/^/  /'
  tail -n +2 /tmp/expect.err | head -n 4 | sed 's/^/    /'
  return $rc
}

# transports NAME PORT WANT HOST...: every connection end on PORT that
# HOST's daemon reported in any sample of run NAME was on WANT, and there
# was at least one.
transports() {
  name=$1; port=$2; want=$3; shift 3
  for h in "$@"; do
    expect_status "$name transport $h" --from /tmp/st.$name.$h --port $port \
      --expect "transport=$want,ends>=1" || last_errors $name $h
  done
}

# last_errors NAME HOST: what failed samples of run NAME in HOST said.
last_errors() {
  [ -s /tmp/st.$1.$2.err ] && tail -n 3 /tmp/st.$1.$2.err | sed "s/^/    sampler $2: /"
  return 0
}

# last_sample NAME PORT: what the daemons last said about PORT's
# connections, ring counters included (for a run that failed).
last_sample() {
  for h in A B; do
    [ -s /tmp/st.$1.$h ] || continue
    tail -n 1 /tmp/st.$1.$h > /tmp/st.last
    ringsock-ctl status --from /tmp/st.last --port $2 | sed "s/^/    last status $h: /"
  done
}

# tally NAME PORT: "rdma=N,tcp=N,shm=N", the connection ends on PORT that
# either daemon reported on each transport in any sample of run NAME.
tally() {
  from=""
  for h in A B; do [ -e /tmp/st.$1.$h ] && from="$from --from /tmp/st.$1.$h"; done
  if [ -n "$from" ]; then
    ringsock-ctl status $from --port $2 --count
  else
    echo "rdma=0,tcp=0,shm=0"
  fi
}
