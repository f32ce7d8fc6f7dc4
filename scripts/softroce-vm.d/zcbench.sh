# Guest script (scripts/softroce-vm; not run by CI): zero-copy sends
# against the copy path through the shim between hosts A and B, with
# kernel TCP in the same run. An iperf3 client in B sends -n 16M to a
# server in A at -l 256K and 1M: kernel TCP (no shim), the shim copying,
# the shim with RINGSOCK_ZEROCOPY_MIN=65536 on the sending client; 5
# repetitions alternating. Prints "ZC LEN MODE REP Mbit/s ZC_LOGGED"
# (ZC_LOGGED: the client's shim logged a zero-copy send).
#   scripts/softroce-vm --timeout 500 scripts/softroce-vm.d/zcbench.sh \
#     target/release/libringsock.so target/release/ringsock-ctl "$(command -v iperf3)"
. /guest.d/twohosts.sh
. /guest.d/shimhosts.sh
$SA iperf3 -s -B $SRV -p 7202 > /tmp/iperf.srv 2>&1 &
wait_listen A 7202
$PA iperf3 -s -B $SRV -p 7203 > /tmp/iperf.plain 2>&1 &
wait_listen A 7203
for rep in 1 2 3 4 5; do
  for len in 256K 1M; do
    for mode in kernel copy zc; do
      env=; [ $mode = zc ] && env="RINGSOCK_ZEROCOPY_MIN=65536"
      lb=$(wc -l < /tmp/shimB.log)
      if [ $mode = kernel ]; then run="$PB"; port=7203; else run="$SB $env"; port=7202; fi
      timeout 60 $run iperf3 -c $SRV -p $port -n 16M -l $len -J > /tmp/z.json 2>&1
      v=$(awk 'index($0, "\"sum_received\"") { f = 1 } f && /"bits_per_second":/ { gsub(/[^0-9.]/, "", $2); printf "%.2f\n", $2 / 1e6; exit }' /tmp/z.json)
      z=$(tail -n +$((lb + 1)) /tmp/shimB.log | grep -c 'zero-copy: first send')
      echo "ZC $len $mode $rep ${v:-FAIL} $z"
    done
  done
done
