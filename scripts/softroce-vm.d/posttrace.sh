# Guest script (scripts/softroce-vm; not run by CI): where a round trip
# goes, the shim against the verbs ring library, both ends spinning 20 ms
# between hosts A and B. ftrace's function_graph times every post (`ib_uverbs_post_send`:
# on Soft-RoCE the kernel builds, delivers, places and acknowledges the
# WRITE inside it) and every `rxe_responder` call (the placing), with
# absolute times. Per process it prints the posts' median length and the
# median turnaround: from the moment the peer's post placed a message (or
# the process's own post returned, if later) to the start of its next
# post, which is noticing the message, the program's recv and send, and
# building the request. Tracing slows everything: compare the two
# systems within one run only.
#   scripts/softroce-vm --timeout 600 scripts/softroce-vm.d/posttrace.sh \
#     target/release/verbscheck target/release/libringsock.so target/release/ringsock-ctl
# SIZES (default "64 4096") and ROUNDS (default 2) shape the run.
# Output: "TRACE NAME PID: posts N med US | turnaround n=N med US" and
# each ping-pong's RESULT line (its round trip, traced).
. /guest.d/twohosts.sh
. /guest.d/shimhosts.sh
SIZES=${SIZES:-64 4096}
ROUNDS=${ROUNDS:-2}
T=/sys/kernel/tracing
mount -t tracefs nodev $T 2>/dev/null
echo rxe_responder > $T/set_ftrace_filter || { echo "SETUP FAILED: no rxe_responder to trace"; exit 3; }
echo ib_uverbs_post_send >> $T/set_ftrace_filter || { echo "SETUP FAILED: no ib_uverbs_post_send to trace"; exit 3; }
echo function_graph > $T/current_tracer || { echo "SETUP FAILED: no function_graph tracer"; exit 3; }
for o in funcgraph-proc funcgraph-tail funcgraph-abstime; do echo $o > $T/trace_options; done
echo 16384 > $T/buffer_size_kb
echo 0 > $T/tracing_on
port=7600

# iters SIZE: enough round trips to outlast the start-up wait and the
# 0.8 s window at the traced pace (tens of µs a round trip at 64 B,
# hundreds at 4 KiB; the shim's handshake under TCG takes up to a second
# more).
iters() { if [ "$1" -le 1024 ]; then echo 80000; else echo 20000; fi; }

# trace NAME: 0.8 s of posts and placements, summarised per process.
# Lines: "TIME | CPU) COMM-PID | DURATION | FUNCTION"; a post is an
# entry line ("... {") and a closing line ("} /* ... */" with its
# length), a placement a leaf line ("rxe_responder [rdma_rxe]();").
trace() {
  : > $T/trace; echo 1 > $T/tracing_on; sleep 0.8; echo 0 > $T/tracing_on
  awk -F'|' '
    function med(H, n,   c, i) { c = 0; for (i = 0; i <= 3000; i++) { c += H[i]; if (c * 2 >= n) return i } return -1 }
    function bucket(us) { us = int(us); return us < 0 ? 0 : (us > 3000 ? 3000 : us) }
    NF >= 4 {
      ts = $1; gsub(/ /, "", ts)
      p = $2; sub(/^ *[0-9]+\) */, "", p); sub(/ *$/, "", p)
      d = $3; gsub(/[ +!#*@$]/, "", d); sub(/us$/, "", d)
      f = $4; gsub(/^ +| +$/, "", f)
      if (f ~ /^ib_uverbs_post_send.*\{$/) {
        # Ready: the latest placement by any other thread (a thread of
        # the same process, such as the shim background one, counts as
        # another poster), or the end of the last post of this thread,
        # if later.
        PIDS[p] = 1; ready = last_exit[p]
        for (q in placed) if (q != p && placed[q] > ready) ready = placed[q]
        if (ready > 0) { TA[p, bucket((ts - ready) * 1e6)]++; TN[p]++ }
        next
      }
      if (f ~ /^\} \/\* ib_uverbs_post_send/) { last_exit[p] = ts; PH[p, bucket(d)]++; PN[p]++; next }
      if (f ~ /^rxe_responder.*\);$/) { placed[p] = ts + d / 1e6; next }
    }
    END {
      for (p in PIDS) {
        if (PN[p] < 100) continue
        for (i = 0; i <= 3000; i++) { h[i] = TA[p, i]; g[i] = PH[p, i] }
        printf "TRACE %s %s: posts %d med %d us | turnaround n=%d med %d us\n", NAME, p, PN[p], med(g, PN[p]), TN[p], med(h, TN[p])
      }
    }' NAME=$1 $T/trace
}

shim() { # NAME SIZE
  port=$((port + 1))
  $SA RINGSOCK_SPIN_US=20000 verbscheck tcp-serve --listen $SRV:$port > /tmp/srv.log 2>&1 &
  p=$!; wait_listen A $port > /dev/null
  $SB RINGSOCK_SPIN_US=20000 verbscheck pingpong --tcp --connect $SRV:$port --sizes $2 \
    --iters $(iters $2) --bw-mib 0 --reps 1 > /tmp/cli.$1 2>&1 &
  c=$!; sleep 2.5   # the shim's handshake through both daemons, under TCG
  trace $1
  wait $c; stop $p; grep -h "test=pingpong" /tmp/cli.$1 | cut -c1-110 | sed "s/^/$1 /"
}

library() { # NAME SIZE (heads pushed every 1,024 slots, as on the shim's rings)
  port=$((port + 1))
  $A verbscheck serve --listen $SRV:$port --spin-us 20000 --gamma 1024 > /tmp/srv.log 2>&1 &
  p=$!; wait_listen A $port > /dev/null
  $B verbscheck pingpong --connect $SRV:$port --spin-us 20000 --gamma 1024 --sizes $2 \
    --iters $(iters $2) --bw-mib 0 --reps 1 > /tmp/cli.$1 2>&1 &
  c=$!; sleep 1.5
  trace $1
  wait $c; stop $p; grep -h "test=pingpong" /tmp/cli.$1 | cut -c1-110 | sed "s/^/$1 /"
}

r=1
while [ $r -le $ROUNDS ]; do
  for s in $SIZES; do shim shim-$s-$r $s; library library-$s-$r $s; done
  r=$((r + 1))
done
