// SPDX-License-Identifier: GPL-2.0
// Loopback TCP shortcut for comparison with ringsock: established IPv4
// loopback sockets go into a SOCKHASH keyed by their 4-tuple, and every
// send on one of them is moved straight onto the peer socket's receive
// queue (BPF_F_INGRESS), skipping the TCP/IP stack. Loaded and attached by
// scripts/sockmap; GPL because bpf_msg_redirect_hash is GPL-only.

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

// Both ends of one connection have keys that are each other's reverse.
// Addresses in network order as the kernel gives them; ports in host order.
struct sock_key {
	__u32 local_ip;
	__u32 remote_ip;
	__u32 local_port;
	__u32 remote_port;
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_key);
	__type(value, __u32);
} rs_sockhash SEC(".maps");

// Counters `scripts/sockmap status` prints, so a run can show that the
// redirect was in use rather than assume it.
enum { C_INSERTED, C_INSERT_FAILED, C_REDIRECTED, C_PASSED, C_NR };

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, C_NR);
	__type(key, __u32);
	__type(value, __u64);
} rs_counts SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&rs_counts, &which);

	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline int loopback(__u32 ip_be)
{
	return (ip_be & bpf_htonl(0xff000000)) == bpf_htonl(0x7f000000);
}

// remote_port holds the big-endian port in its upper half (sock_ops and
// sk_msg alike), so bpf_ntohl gives it in host order; local_port is
// already in host order.
SEC("sockops")
int rs_sockops(struct bpf_sock_ops *skops)
{
	struct sock_key key;

	if (skops->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB &&
	    skops->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	if (skops->family != 2 /* AF_INET */ || !loopback(skops->local_ip4) ||
	    !loopback(skops->remote_ip4))
		return 1;
	key.local_ip = skops->local_ip4;
	key.remote_ip = skops->remote_ip4;
	key.local_port = skops->local_port;
	key.remote_port = bpf_ntohl(skops->remote_port);
	if (bpf_sock_hash_update(skops, &rs_sockhash, &key, BPF_NOEXIST) == 0)
		count(C_INSERTED);
	else
		count(C_INSERT_FAILED);
	return 1;
}

// A failed lookup (the peer is not in the map: it lives outside the
// cgroup, or it already closed) must not drop the data, which
// bpf_msg_redirect_hash's SK_DROP would: the send then takes the normal
// TCP path.
SEC("sk_msg")
int rs_redirect(struct sk_msg_md *msg)
{
	struct sock_key peer;

	peer.local_ip = msg->remote_ip4;
	peer.remote_ip = msg->local_ip4;
	peer.local_port = bpf_ntohl(msg->remote_port);
	peer.remote_port = msg->local_port;
	if (bpf_msg_redirect_hash(msg, &rs_sockhash, &peer, BPF_F_INGRESS) == SK_PASS) {
		count(C_REDIRECTED);
		return SK_PASS;
	}
	count(C_PASSED);
	return SK_PASS;
}

char _license[] SEC("license") = "GPL";
