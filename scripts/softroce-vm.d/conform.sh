# Guest script for scripts/softroce-vm (busybox sh, run as /guest.sh): a
# subset of the conformance suite (conformance/, `conform run`) between two
# hosts over RDMA verbs. Hosts A and B and their daemons come from
# twohosts.sh and shimhosts.sh; the server role runs in A (10.8.0.1), the
# client role in B, each scenario once plain and once with both ends under
# the shim, where every barrier that asks for rings must find both ends on
# transport "rdma" in the two daemons' status (runner/hosts.rs).
#
# Part of scripts/test. `conform run` between two hosts only reports
# (conformance/src/known.rs describes shared-memory rings on one host);
# this script judges: it fails when a plain run fails (a scenario broken
# on this topology), a shim run differs from the plain run, or a shim run
# is not on rdma.
#
#   cargo build --release -p ringsock-preload -p ringsock-ctl -p ringsock-conformance
#   scripts/softroce-vm --timeout 900 scripts/softroce-vm.d/conform.sh \
#     target/release/libringsock.so target/release/ringsock-ctl target/release/conform
#
# The subset: scenarios that hold on any TCP path (none that asks whether
# bytes are visible the instant the peer's call returned, which only
# loopback promises), without python3 (not in the guest) or IPv6.
SUBSET="echo_small size_1b size_64k size_1m many_small_sends peek_then_read
waitall_blocks_for_rest dontwait_empty_then_data recv_blocks_until_data
half_close_client readv_writev read_write_syscalls fionread_siocinq
sockopt_basics poll_rdhup_on_fin poll_hup_after_both_shut
select_blocks_until_data epoll_level_triggered epoll_edge_new_arrival
epoll_blocks_until_data peer_close_unread_data peer_exit_after_write
peer_close_while_recv_blocked fork_child_closes_parent_continues
fork_child_writes_exits_parent_writes exec_inherited_reads
exec_inherited_writes exec_in_place_reads_and_writes"

t0=$(cut -d' ' -f1 /proc/uptime)
. /guest.d/twohosts.sh
. /guest.d/shimhosts.sh

step "conformance subset, server in A, client in B"
export CONFORM_SERVER_IP=$SRV
export CONFORM_SERVER_WRAP="$A"
export CONFORM_CLIENT_WRAP="$B"
export CONFORM_SERVER_CTL=/tmp/ctlA.sock
export CONFORM_CLIENT_CTL=/tmp/ctlB.sock
export CONFORM_SHIM=$SHIM
export CONFORM_TRANSPORT=rdma
export CONFORM_DEADLINE_S=90
# The shim's generous bounds under TCG (shimhosts.sh says why).
export RINGSOCK_CONNECT_TIMEOUT_MS=15000
export RINGSOCK_CLAIM_WAIT_MS=5000
# shellcheck disable=SC2086
conform run --jobs 1 $SUBSET > /tmp/conform.out 2>&1
rc=$?
cat /tmp/conform.out
offring=$(grep -c '^not on rdma' /tmp/conform.out)
# One line per scenario: "ok  same ...", "ok  differs ...", "BAD broken ...".
differing=$(grep -cE '^(ok |BAD) (differs|broken) ' /tmp/conform.out)
judged=$(grep -cE '^(ok |BAD) [a-z]+ ' /tmp/conform.out)
# shellcheck disable=SC2086
wanted=$(echo $SUBSET | wc -w)

step "logs"
for h in A B; do echo "--- ctl $h (last 6 lines)"; tail -n 6 /tmp/ctl$h.log; done
stop $ctlpidA $ctlpidB
t1=$(cut -d' ' -f1 /proc/uptime)
echo "GUEST-SECONDS from=$t0 to=$t1"
echo "CONFORM-CHECK run rc=$rc, $judged of $wanted scenario(s) judged, $differing differ or broken, $offring barrier(s) not on rdma"
if [ $rc -eq 0 ] && [ "$offring" -eq 0 ] && [ "$differing" -eq 0 ] && [ "$judged" -eq "$wanted" ]; then
  echo "CONFORM-CHECK PASSED"
  exit 0
fi
echo "CONFORM-CHECK FAILED"
exit 1
