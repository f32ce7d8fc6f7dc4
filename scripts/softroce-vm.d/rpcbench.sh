# Guest script for scripts/softroce-vm (busybox sh), run by
# scripts/bench-pull: many clients to one server over the verbs ring
# library between hosts A and B (twohosts.sh). One `verbscheck rpc-serve`
# process in A serves every connection from one polling thread; one
# `verbscheck rpc` process in B runs N client connections (a thread each)
# doing 64 B request / SIZE reply round trips for SECS seconds. The
# server's RINGSOCK_VERBS_MODE is push, pull or adaptive (its replies);
# the clients push their requests. Repetitions alternate the modes
# (push pull adaptive push pull adaptive ...). Prints one
# "BENCH rep= mode= clients= size= ..." line per run, plus the server's
# per-connection lines (work requests it posted per reply).
#
# Adaptive thresholds are scaled to what an emulated guest reaches (the
# defaults, 100000/50000 publishes per second, are for hardware): the
# server pulls above RPC_HIGH replies per second, pushes again at or below
# RPC_LOW, measured over 50 ms windows, at least 100 ms between switches.
REPS=${REPS:-3}
SECS=2
CLIENTS="1 4 16"
SIZES=64,4096
RPC_HIGH=400
RPC_LOW=200

. /guest.d/twohosts.sh
t0=$(uptime_s)
port=7400
for rep in $(seq 1 $REPS); do
  for mode in push pull adaptive; do
    for n in $CLIENTS; do
      port=$((port + 1))
      $A RINGSOCK_VERBS_MODE=$mode RINGSOCK_PULL_HIGH=$RPC_HIGH RINGSOCK_PULL_LOW=$RPC_LOW \
        RINGSOCK_PULL_WINDOW_US=50000 RINGSOCK_PULL_DWELL_MS=100 \
        verbscheck rpc-serve --listen $SRV:$port > /tmp/rs.log 2>&1 &
      spid=$!
      sleep 0.5
      $B RINGSOCK_VERBS_MODE=push timeout 120 verbscheck rpc --connect $SRV:$port --clients $n \
        --sizes $SIZES --secs $SECS --spin-us 200 > /tmp/rc.log 2>&1
      rc=$?
      sleep 0.5
      kill $spid 2>/dev/null; wait $spid 2>/dev/null
      grep 'test=rpc ' /tmp/rc.log | sed "s/^RESULT /BENCH rep=$rep mode=$mode rc=$rc /"
      grep 'test=rpc-serve' /tmp/rs.log | sed "s/^RESULT /SERVER rep=$rep mode=$mode clients=$n /"
      grep -v RESULT /tmp/rc.log /tmp/rs.log | grep -iv "serving" | head -n 3
    done
  done
done
echo "GUEST-SECONDS from=$t0 to=$(uptime_s)"
echo "RPCBENCH DONE"
