# Guest script (scripts/softroce-vm; CI runs it): a writer that goes quiet
# after a send, or exits with its socket open, must not hold back or lose
# its bytes over rdma rings. A shimmed
# quietsend client in B connects to a shimmed quietsend server in A; three
# times it sleeps 1.5 s, sends one byte and sleeps 2 s outside the shim,
# then checks (through a file the server writes after each byte) that the
# byte arrived while it slept. On verbs the check for the sleeping reader
# is owed when the send's tail WRITE completes, which only the shim's
# background thread sees: were the wake-up for that post lost
# (ringsock_ring::sleep::park), every byte would wait for the writer's
# close.
#   cargo build --release -p ringsock-preload -p ringsock-ctl
#   cargo build --release -p ringsock-integration --bin quietsend --bin exitsend
#   scripts/softroce-vm --timeout 120 scripts/softroce-vm.d/quiet.sh \
#     target/release/libringsock.so target/release/ringsock-ctl target/release/quietsend \
#     target/release/exitsend
. /guest.d/twohosts.sh
. /guest.d/shimhosts.sh
fail=0
pass() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
port=7301
rm -f /tmp/q.mark
sample_start quiet
$SA quietsend server --host $SRV --port $port --rounds 3 --mark /tmp/q.mark > /tmp/q.srv 2>&1 &
qsrv=$!
wait_listen A $port
timeout 40 $SB quietsend client --host $SRV --port $port --rounds 3 --mark /tmp/q.mark \
  --before-ms 1500 --after-ms 2000 > /tmp/q.cli 2>&1
echo "client exit $?: $(tr '\n' ' ' < /tmp/q.cli)"
i=0
while kill -0 $qsrv 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
stop $qsrv
sample_stop quiet
echo "server: $(tr '\n' ' ' < /tmp/q.srv)"
if grep -qx ok /tmp/q.cli; then pass "quiet writer: all 3 bytes arrived while the writer slept"
else bad "quiet writer: $(grep FAIL /tmp/q.cli || echo 'client did not finish')"; fi
if grep -qx ok /tmp/q.srv && ! grep -q FAIL /tmp/q.srv; then pass "quiet reader: 3 bytes then EOF"
else bad "quiet reader: $(tr '\n' ' ' < /tmp/q.srv)"; fi
expect_status "quiet transport" --from /tmp/st.quiet.A --from /tmp/st.quiet.B --port $port \
  --expect "transport=rdma,ends>=1" || last_sample quiet $port

# A writer that exits with its socket open (exitsend): 200 KB (less than
# a ring) in 100-byte writes, then exit or _exit without close. The queue
# pair dies with the process, and the batch and WRITEs it had not sent
# with it, unless the exit drain (atexit handler, _exit hook) flushes and
# waits for them. rxe under TCG may send what was queued before the queue
# pair goes even without the drain, so this check can pass without it;
# the host test tests/exit_drain.rs checks the drain on shm. This checks
# the property on verbs.
for how in exit _exit; do
  port=$((port + 1))
  sample_start exit$how
  $SA exitsend server --host $SRV --port $port > /tmp/x.srv 2>&1 &
  xsrv=$!
  wait_listen A $port
  timeout 40 $SB exitsend client --host $SRV --port $port --bytes 200000 --chunk 100 \
    --pause-ms 1500 --how $how > /tmp/x.cli 2>&1
  i=0
  while kill -0 $xsrv 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
  stop $xsrv
  sample_stop exit$how
  sent=$(sed -n 's/^sent //p' /tmp/x.cli); got=$(sed -n 's/^got //p' /tmp/x.srv)
  if [ -n "$sent" ] && [ "$sent" = "$got" ]; then pass "exit drain ($how): reader got $got"
  else bad "exit drain ($how): writer sent '$sent', reader got '$got' $(cat /tmp/x.cli /tmp/x.srv | tr '\n' ' ')"; fi
  expect_status "exit drain ($how) transport" --from /tmp/st.exit$how.A --from /tmp/st.exit$how.B \
    --port $port --expect "transport=rdma,ends>=1" || last_sample exit$how $port
done
[ $fail -eq 0 ] && echo "QUIET-CHECK PASSED" || { echo "QUIET-CHECK FAILED"; tail -n 20 /tmp/shimA.log /tmp/shimB.log; }
exit $fail
