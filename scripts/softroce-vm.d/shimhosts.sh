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
# /tmp/st.NAME.{A,B}. Each sample starts two ringsock-ctl processes: at
# 0.2 s they took about a sixth of the guest's CPU during a bulk run (perf),
# so benchmarks sample less often (programs.sh).
SAMPLE_SECS=${SAMPLE_SECS:-0.2}
sample_start() { # NAME
  rm -f /tmp/st.$1.A /tmp/st.$1.B
  ( while :; do
      for h in A B; do
        ringsock-ctl status --json --socket /tmp/ctl$h.sock >> /tmp/st.$1.$h 2>&1
        echo >> /tmp/st.$1.$h
      done
      sleep $SAMPLE_SECS
    done ) &
  smppid=$!
}
sample_stop() { # NAME: one last sample, then the sampler ends
  kill $smppid 2>/dev/null
  wait $smppid 2>/dev/null
  for h in A B; do ringsock-ctl status --json --socket /tmp/ctl$h.sock >> /tmp/st.$1.$h 2>&1; echo >> /tmp/st.$1.$h; done
}

# conns FILE PORT: the reported connections whose local or peer port is
# PORT, one "transport local peer pid=N reason=..." line each, unique.
conns() {
  awk -v want=":$2\"" '
    function str(s, k) { if (match(s, "\"" k "\":\"[^\"]*\"")) return substr(s, RSTART + length(k) + 4, RLENGTH - length(k) - 5); return "-" }
    function num(s, k) { if (match(s, "\"" k "\":[0-9]+")) return substr(s, RSTART + length(k) + 3, RLENGTH - length(k) - 3); return "-" }
    { n = split($0, c, "\"session\":")
      for (i = 2; i <= n; i++)
        if (index(c[i], want))
          print str(c[i], "transport"), str(c[i], "local"), str(c[i], "peer"), "pid=" num(c[i], "pid"), "reason=" str(c[i], "reason") }' "$1" | sort -u
}

# last_sample NAME PORT: what the daemons last said about PORT's
# connections, ring counters included (for a run that failed).
last_sample() {
  for h in A B; do
    grep connections /tmp/st.$1.$h | tail -n 1 \
      | awk -v want=":$2\"" '{ n = split($0, c, "\"session\":"); for (i = 2; i <= n; i++) if (index(c[i], want)) print "    last status '$h': " substr(c[i], 1, 900) }'
  done
}


# tally NAME PORT: "rdma=N,tcp=M,shm=K", the transports of the connections
# on PORT that either daemon reported in any sample of run NAME.
tally() {
  for h in A B; do [ -e /tmp/st.$1.$h ] && conns /tmp/st.$1.$h $2; done \
    | awk '{ n[$1]++ } END { printf "rdma=%d,tcp=%d,shm=%d\n", n["rdma"], n["tcp"], n["shm"] }'
}
