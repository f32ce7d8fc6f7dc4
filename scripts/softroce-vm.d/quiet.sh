# Guest script (scripts/softroce-vm; not run by CI): reproduces a known
# stall on rdma rings (README limits). A shimmed quietsend client in B
# connects to a shimmed quietsend server in A, sleeps 4 s, sends one byte,
# sleeps 4 s (outside the shim) and closes. The server's first recv should
# return about 4 s after accept (minus the ring setup); in the guest it
# returns only when the client closes (waited_ms about 6900, 2026-11-23).
#   cargo build --release -p ringsock-preload -p ringsock-ctl -p ringsock-integration --bin quietsend
#   scripts/softroce-vm --timeout 200 scripts/softroce-vm.d/quiet.sh \
#     target/release/libringsock.so target/release/ringsock-ctl target/release/quietsend
. /guest.d/twohosts.sh
. /guest.d/shimhosts.sh
$SA quietsend server --host $SRV --port 7301 > /tmp/q.srv 2>&1 &
wait_listen A 7301
echo "client start $(cut -d' ' -f1 /proc/uptime)"
timeout 20 $SB quietsend client --host $SRV --port 7301 --before-ms 4000 --after-ms 4000
echo "client end $(cut -d' ' -f1 /proc/uptime)"
sleep 1
echo "QUIET $(tr '\n' ' ' < /tmp/q.srv)"
