// SPDX-License-Identifier: GPL-2.0
/*
 * fabric-emu switch and NIC ports: traffic classes, per-packet ECN marking, buffer accounting
 * and PFC threshold crossings, as tc (clsact, direct-action) programs.
 *
 * The programs share the maps below (loaded once per run, pinned under
 * /sys/fs/bpf/fabric-emu/<run id>/):
 *
 *   switch_egress  every switch port, egress: picks the traffic class (skb->priority selects
 *                  the HTB class), admits or tail-drops against the class's byte limit (lossless
 *                  frames: against what their ingress port holds, see "Lossless admission"),
 *                  and marks ECT packets CE on the RED profile of the class's depth.
 *   switch_ingress every switch port, ingress: the frame has left its upstream queue, so the
 *   host_ingress   bytes are credited back to it (and XON crossings signalled); PFC frames are
 *                  consumed and reported to the PFC daemon. At a switch port a lossless frame
 *                  is then charged to the port it enters by, less what switch_arrival charged
 *                  ahead of it, and XOFF crossings signalled. host_ingress (host NICs) does
 *                  the same without the charge.
 *   switch_arrival tracepoint net:netif_rx: charges a lossless frame to the switch port it
 *                  enters by where its veth hands it over (see "Charging at the hand-off");
 *                  switch_arrival_dropped gives back the charge of one the kernel then drops.
 *   host_egress    host NICs, egress: traffic class; and when the host's leaf runs DLB, the
 *                  leaf's flowlet stage (below), which picks each new flowlet's uplink.
 *   qp_classify    host NICs, a filter of the per-queue-pair HTB inside the RoCE class's PFC
 *                  gate (fabric_emu/ports/qp_limiter.py): a packet whose socket mark names a
 *                  queue pair goes to that pair's rate class, anything else (ACKs, unmarked
 *                  traffic) to the HTB's unshaped direct queue.
 *
 * How the far end knows which queue and which ingress port a frame was charged to: the
 * switch's first OpenFlow table writes the ingress port id into the source MAC
 * (0e:fe:<in port id>:00:00) and switch_egress adds its own port id
 * (0e:fe:<in port id>:<out port id>). A real router rewrites the source MAC at every hop
 * too; we use those bytes to carry the two ids across the wire. Open vSwitch's userspace
 * datapath keeps no other per-packet metadata between a switch's ingress and egress.
 *
 * Everything is accounted in frame bytes as the qdiscs count them (skb->len: Ethernet header
 * and payload, no FCS), so the accounting can be checked against the qdisc backlog.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <linux/types.h>
#include <stddef.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define NPRIO 8
#define MAX_PORTS 4096
#define NO_PORT 0xffff
#define PRIO_LOSSLESS 3
#define PRIO_CNP 6
#define DSCP_ROCE 26
#define DSCP_CNP 48
#define ETH_P_MAC_CONTROL 0x8808
#define PFC_OPCODE 0x0101
#define HTB_MAJOR 0x10000
#define CLASS_MINOR_BASE 0x10 /* class 1:10 + priority */
#define QP_MINOR_BASE 0x100	/* queue pair k: mark and class minor 0x100 + k */
/* Drops at egress return TC_ACT_STOLEN, not TC_ACT_SHOT: Open vSwitch sends a switch's output
 * in batches with one sendmmsg(), and a SHOT makes that call fail (ENOBUFS), upon which OVS
 * discards the rest of the batch, uncounted. Those frames were already charged to their ingress
 * port, so a single drop leaked up to 31 frames of buffer for good: a port left above xon
 * pauses its upstream forever (a PFC deadlock the emulator made, not the fabric). STOLEN frees
 * the frame and reports success, so every other frame of the batch goes on, as in a switch
 * whose queue drops one frame. */
#define TAG0 0x0e
#define TAG1 0xfe
/* Bit 0 of the source MAC's second byte: "charge this frame where its link hands it to a switch"
 * (a lossless IPv4 frame with TTL left to forward), set by the egress program that sent it:
 * see "Charging at the hand-off". TAG1, UNTAG1 and the hosts' MACs (02:fe:..., topo/plan.py)
 * have it clear. */
#define MAC_CHARGE 0x01
/* 02:00: a locally administered unicast MAC that is no tag (stitch_out; the other four bytes
 * stay). Hosts' MACs start 02:fe. */
#define UNTAG0 0x02
#define UNTAG1 0x00

static __always_inline int tagged(const struct ethhdr *eth)
{
	return eth->h_source[0] == TAG0 && (eth->h_source[1] & ~MAC_CHARGE) == TAG1;
}

/* Marked MAC_CHARGE: by a switch (0e:ff), a host (02:ff) or a switch on another machine (02:01). */
static __always_inline int marked_to_charge(const __u8 *src)
{
	return (src[0] == TAG0 && src[1] == (TAG1 | MAC_CHARGE)) ||
	       (src[0] == UNTAG0 && (src[1] == (TAG1 | MAC_CHARGE) || src[1] == (UNTAG1 | MAC_CHARGE)));
}

#define PORT_SWITCH 1
#define PORT_ECN 2
#define PORT_PFC 4
#define PORT_ORPHAN 8	/* kernel datapath: a host's frame leaves its socket here (see orphan()) */
/* skb->mark of the copy orphan() sends back into its port: it was charged on hand-off already. */
#define ORPHAN_MARK 0x6f727068

enum event_type { EV_XOFF = 1, EV_XON = 2, EV_PFC_RX = 3, EV_NIC_XOFF = 4 };

/* One entry per port id. The layout is mirrored in fabric_emu/ports/layout.py (a unit test
 * compares the two). Userspace writes the config part, the programs the state and counters,
 * the PFC daemon the last block; readers mmap the whole array. */
struct port {
	/* config (userspace) */
	__u64 flags;
	__u64 limit[NPRIO];	/* egress byte limit per class (tail drop); lossless with PFC: the
				 * most this port may hold as an ingress port (its buffer) */
	__u64 kmin, kmax, pmax32;	/* ECN profile of the lossless class; pmax * 2^32 */
	__u64 xoff, xon, headroom;	/* this port as an ingress port, lossless class */
	/* state (programs) */
	__u64 queue[NPRIO];	/* bytes admitted to this egress port and not yet at its peer */
	__u64 held[NPRIO];	/* bytes in the switch that entered through this port */
	__u64 xoff_state;	/* 1 while this port asks its upstream to pause */
	/* counters (programs) */
	__u64 tx_packets[NPRIO];
	__u64 tx_bytes[NPRIO];
	__u64 drops[NPRIO];
	__u64 marked[NPRIO];
	__u64 max_queue[NPRIO];
	__u64 max_held[NPRIO];
	__u64 lossless_drops;
	__u64 xoff_crossings;
	__u64 xon_crossings;
	__u64 headroom_overruns;	/* lossless frames admitted beyond xoff + headroom (late pause) */
	/* counters (PFC daemon) */
	__u64 pause_tx[NPRIO];
	__u64 pause_rx[NPRIO];
	__u64 paused_ns[NPRIO];
	__u64 paused_since[NPRIO];
	__u64 events_lost;	/* events about this port the ring buffer had no room for */
	/* PFC watchdog and storms (docs/pfc-watchdog.md) */
	__u64 wd_drop;		/* daemon: the watchdog's drop action holds this port's lossless queue */
	__u64 peer_wd_drop;	/* daemon: 1 + the id of this port's peer when the watchdog's drop
				 * action holds the peer: its ingress drops are made here, at this
				 * egress, since Open vSwitch's userspace datapath reads a port's
				 * frames before its tc ingress hook could drop them */
	__u64 peer_stalled;	/* runner: the NIC beyond this switch port has stalled (a PFC storm) */
	__u64 rx_lossless;	/* programs: lossless data frames that entered the switch here while
				 * the watchdog held this queue stormed (wd_status) */
	__u64 rx_wd_drops;	/* programs: lossless frames for here the watchdog's drop action
				 * dropped at the peer's egress (switch peers only) */
	__u64 peer_drops;	/* programs: lossless frames sent here that the stalled NIC dropped */
	__u64 wd_status;	/* daemon: 1 while the watchdog holds this queue stormed */
	__u64 wd_detected, wd_restored;	/* daemon: storms detected and restored on this queue */
	/* The receive buffer of the NIC beyond this switch port (a slow receiver), when modelled:
	 * lossless bytes arriving there are held until the host takes them at nic_rx_rate; above
	 * nic_rx_xoff the NIC pauses this port (the daemon sends it, and its XON once the buffer
	 * has drained below its xon: draining is a matter of time, not of arrivals). */
	__u64 nic_rx_rate;	/* userspace: emulated bytes per second the host drains; 0: not modelled */
	__u64 nic_rx_limit, nic_rx_xoff;	/* userspace: the buffer, and where it pauses */
	__u64 nic_rx_occ, nic_rx_last;	/* programs: bytes held at nic_rx_last (ktime ns) */
	__u64 nic_rx_state;	/* programs set it at xoff, the daemon clears it at xon */
	__u64 nic_rx_xoffs, nic_rx_drops;	/* programs: xoff crossings; frames beyond the buffer */
	/* A link a run's events cut is built with a wire in the middle (fabric_emu/fabric/wires.py):
	 * cut, the wire is down and this port up without carrier, so Open vSwitch's frames for the
	 * dead link still reach this port's egress program, which drops them and gives a lossless
	 * frame's bytes back to its ingress port. (A port taken down refuses them before any program
	 * sees them: their charge stayed for good, and paused that ingress's upstream for ever.) */
	__u64 link_cut;	/* runner: 1 while this port's link is cut */
	__u64 cut_drops;	/* programs: frames dropped at this egress because its link was cut */
	/* Charging at the hand-off (below): lossless bytes switch_arrival charged that the port's tc
	 * ingress has not yet taken in (signed), and the frames charged there and at the tc ingress. */
	__u64 handed_over;
	__u64 handoff_charges, ingress_charges;
};
_Static_assert(sizeof(struct port) == 1112, "struct port must stay 1112 bytes (fabric_emu/ports/layout.py)");

struct event {
	__u64 time_ns;	/* bpf_ktime_get_ns: CLOCK_MONOTONIC */
	__u32 type;
	__u32 port;	/* XOFF/XON: the ingress port; PFC_RX: the port that sent the frame */
	__u32 quanta;	/* PFC_RX: pause time of the lossless class */
	__u32 vector;	/* PFC_RX: class-enable vector */
	__u64 bytes;	/* XOFF/XON: bytes held at the crossing */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, MAX_PORTS);
	__type(key, __u32);
	__type(value, struct port);
} ports SEC(".maps");

/* Switch ports only (they all live in the root namespace, so ifindexes are unique). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PORTS);
	__type(key, __u32);
	__type(value, __u32);
} port_of_ifindex SEC(".maps");

/* Lossless bytes a switch holds per (ingress port, egress port): key in_id << 16 | out_id, value
 * bytes. The PFC deadlock detector's wait-for graph needs to know which egress an ingress
 * buffer's bytes wait for (fabric_emu/cc/deadlock.py); a port's `held` alone cannot say. The
 * program adds at admission and subtracts where the frame arrives at the far end, as `held`. */
#define MAX_PAIRS 65536
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PAIRS);
	__type(key, __u32);
	__type(value, __u64);
} pair_held SEC(".maps");

static __always_inline void pair_add(__u32 in_id, __u32 out_id, __u64 len, int credit)
{
	__u32 key = in_id << 16 | out_id;
	__u64 *bytes = bpf_map_lookup_elem(&pair_held, &key);

	if (!bytes && !credit) {
		__u64 zero = 0;
		bpf_map_update_elem(&pair_held, &key, &zero, BPF_NOEXIST);
		bytes = bpf_map_lookup_elem(&pair_held, &key);
	}
	if (!bytes)
		return;
	if (credit)
		__sync_fetch_and_sub(bytes, len);
	else
		__sync_fetch_and_add(bytes, len);
}

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);	/* ~26,000 events: the daemon may be off a CPU for a while */
} events SEC(".maps");

/* XOFF crossings again, for the PFC responder (fabric_emu/ports/responder.c), which closes the
 * upstream's gate at once when the upstream is on this machine: a few thousand a run, never per
 * packet, each waking it (BPF_RB_FORCE_WAKEUP) whatever the ring's position. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 18);
} fast SEC(".maps");

/* Dynamic load balancing (flowlet switching) of a leaf, for the RoCE traffic its hosts send to
 * other leaves. A flow (IP/UDP 4-tuple) keeps its uplink while its packets come less than
 * `inactivity_ns` apart; a packet after a longer gap starts a new flowlet, which takes the
 * allowed uplink with the least load: the bytes this leaf sent up each uplink in the current
 * and the previous quality window (window_ns). The choice travels in the IP TTL
 * (DLB_TTL_BASE + uplink index), which the RoCEv2 ICRC does not cover (routers change it);
 * the leaf's OpenFlow rules send each TTL value up its uplink (controller/core.py).
 *
 * Where: on the host's side of the host-leaf link (host_egress), because Open vSwitch's
 * userspace datapath reads a switch port through a packet socket, which sees a frame before
 * the port's tc ingress hook could rewrite it. The wire between the two is instantaneous, so
 * the stage sees the leaf's arrivals, in the leaf's clock; its state is per leaf (by the
 * leaf number in the hosts' addresses, 10.0.<leaf>.<host>). Layout mirrored in
 * fabric_emu/ports/dlb.py. */
#define DLB_MAX_LEAVES 256
#define DLB_MAX_UPLINKS 16
#define DLB_TTL_BASE 192
#define ROCE_PORT 4791

struct dlb_leaf {
	/* config (the controller) */
	__u64 enabled;
	__u64 inactivity_ns;
	__u64 window_ns;
	__u64 n_uplinks;
	__u64 allowed[DLB_MAX_LEAVES];	/* per destination leaf: bitmask of the uplinks that reach it */
	/* state (the program) */
	__u64 window_start;
	__u64 bytes_cur[DLB_MAX_UPLINKS];
	__u64 bytes_prev[DLB_MAX_UPLINKS];
	/* counters (the program) */
	__u64 flowlets[DLB_MAX_UPLINKS];	/* flowlets started on each uplink */
	__u64 moves[DLB_MAX_UPLINKS];	/* of them, flowlets of a flow whose last one took another */
	__u64 packets[DLB_MAX_UPLINKS];
	__u64 bytes[DLB_MAX_UPLINKS];
	/* state (the program), after the counters so the layout above stays */
	__u64 next_start;	/* where the next flowlet's search starts: ties go round-robin */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, DLB_MAX_LEAVES);
	__type(key, __u32);
	__type(value, struct dlb_leaf);
} dlb SEC(".maps");

struct flow_key {
	__u32 saddr, daddr;
	__u16 sport, dport;
};

struct flowlet {
	__u64 last_ns;
	__u32 uplink;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct flowlet);
} flowlets SEC(".maps");

static __always_inline __u32 prio_of(void *data, void *end, struct iphdr **ipp)
{
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);

	*ipp = 0;
	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	*ipp = ip;
	switch (ip->tos >> 2) {
	case DSCP_ROCE:
		return PRIO_LOSSLESS;
	case DSCP_CNP:
		return PRIO_CNP;
	}
	return 0;
}

/* Open vSwitch sends through a packet socket that puts only the Ethernet header in the skb's
 * linear part (packet_snd: linear = hard_header_len), so direct access would see no IP header
 * and class everything 0. Pull the headers we read into the linear part first. */
static __always_inline void pull_headers(struct __sk_buff *skb)
{
	__u32 need = sizeof(struct ethhdr) + sizeof(struct iphdr);

	if (skb->data + need > skb->data_end && skb->len >= need)
		bpf_skb_pull_data(skb, need);
}

static __always_inline void emit(struct port *p, __u32 type, __u32 port, __u32 quanta, __u32 vector, __u64 bytes)
{
	struct event ev = {
		.time_ns = bpf_ktime_get_ns(), .type = type, .port = port,
		.quanta = quanta, .vector = vector, .bytes = bytes,
	};
	if (bpf_ringbuf_output(&events, &ev, sizeof(ev), 0) && p)
		__sync_fetch_and_add(&p->events_lost, 1);
	if (type == EV_XOFF)	/* lost here, the daemon's own close still comes */
		bpf_ringbuf_output(&fast, &ev, sizeof(ev), BPF_RB_FORCE_WAKEUP);
}

/* Bytes charged to ingress port `in` leave the switch (sent on, or dropped): credit them back
 * and signal XON when the port falls below xon. Every path that frees charged bytes goes
 * through here, or a port left above xon would pause its upstream for ever. */
static __always_inline void credit_held(struct port *in, __u32 in_id, __u32 prio, __u32 len)
{
	__u64 held = __sync_fetch_and_sub(&in->held[prio], len) - len;
	if (held < in->xon && in->xoff_state &&
	    __sync_val_compare_and_swap(&in->xoff_state, 1, 0) == 1) {
		__sync_fetch_and_add(&in->xon_crossings, 1);
		emit(in, EV_XON, in_id, 0, 0, held);
	}
}

/* A lossless frame enters a switch by port `me`: charge it, and signal XOFF at xoff. */
static __always_inline void charge(struct port *me, __u32 me_id, __u32 len)
{
	__u64 held = __sync_fetch_and_add(&me->held[PRIO_LOSSLESS], len) + len;
	if (held > me->max_held[PRIO_LOSSLESS])
		me->max_held[PRIO_LOSSLESS] = held;
	if (held >= me->xoff && __sync_val_compare_and_swap(&me->xoff_state, 0, 1) == 0) {
		__sync_fetch_and_add(&me->xoff_crossings, 1);
		emit(me, EV_XOFF, me_id, 0, 0, held);
	}
}

/* Take up to len bytes of what switch_arrival charged ahead; returns how many. */
static __always_inline __u32 take_handed_over(struct port *me, __u32 len)
{
	for (int i = 0; i < 8; i++) {
		__s64 have = (__s64)me->handed_over;
		__u32 take = have <= 0 ? 0 : have < len ? (__u32)have : len;
		if (!take || __sync_val_compare_and_swap(&me->handed_over, (__u64)have, (__u64)(have - take)) == (__u64)have)
			return take;
	}
	return 0;	/* never seen: 8 changes by other CPUs in between; charged in full, as before */
}

/* A tagged frame has arrived at the far end of its link (or left its machine: stitch_out):
 * credit the queue of the port that sent it and, for a lossless frame, the ingress port and
 * pair it was charged to. Returns the sending port, if it is one of this map's. */
static __always_inline struct port *credit_arrival(__u32 in_id, __u32 out_id, __u32 prio, __u32 len)
{
	struct port *from = bpf_map_lookup_elem(&ports, &out_id);

	if (!from)
		return 0;
	__sync_fetch_and_sub(&from->queue[prio], len);
	struct port *in = in_id != NO_PORT ? bpf_map_lookup_elem(&ports, &in_id) : 0;
	if (in && prio == PRIO_LOSSLESS && (from->flags & PORT_PFC)) {
		credit_held(in, in_id, prio, len);
		pair_add(in_id, out_id, len, 1);
	}
	return from;
}

/* The NIC's receive buffer (see struct port): what the host drained since the last frame
 * leaves it, this frame enters it, or is dropped when it does not fit. One NIC's frames arrive
 * on its veth's one receive path, so plain stores are enough. */
static __always_inline int nic_receive(struct port *from, __u32 from_id, __u32 len)
{
	__u64 now = bpf_ktime_get_ns(), last = from->nic_rx_last, occ = from->nic_rx_occ;
	__u64 drained = last && now > last ? (now - last) * from->nic_rx_rate / 1000000000ULL : 0;

	occ = occ > drained ? occ - drained : 0;
	from->nic_rx_last = now;
	if (occ + len > from->nic_rx_limit) {
		from->nic_rx_occ = occ;
		__sync_fetch_and_add(&from->nic_rx_drops, 1);
		return TC_ACT_SHOT;
	}
	occ += len;
	from->nic_rx_occ = occ;
	if (occ >= from->nic_rx_xoff && __sync_val_compare_and_swap(&from->nic_rx_state, 0, 1) == 0) {
		__sync_fetch_and_add(&from->nic_rx_xoffs, 1);
		emit(from, EV_NIC_XOFF, from_id, 0, 0, occ);
	}
	return TC_ACT_OK;
}

/* RED as DCQCN deployments use it, on the instantaneous depth: 0 up to kmin, rising linearly
 * to pmax at kmax, 1 above. */
static __always_inline int should_mark(struct port *p, __u64 depth)
{
	if (depth <= p->kmin)
		return 0;
	if (depth > p->kmax)
		return 1;
	__u64 threshold = p->pmax32 * (depth - p->kmin) / (p->kmax - p->kmin);
	return (__u64)bpf_get_prandom_u32() < threshold;
}

SEC("tc")
int switch_egress(struct __sk_buff *skb)
{
	pull_headers(skb);
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	__u32 ifindex = skb->ifindex, len = skb->len, out_id, in_id = NO_PORT;

	if ((void *)(eth + 1) > end)
		return TC_ACT_OK;
	__u32 *idp = bpf_map_lookup_elem(&port_of_ifindex, &ifindex);
	if (!idp)
		return TC_ACT_OK;
	out_id = *idp;
	struct port *out = bpf_map_lookup_elem(&ports, &out_id);
	if (!out)
		return TC_ACT_OK;

	__u32 prio = prio_of(data, end, &ip) & (NPRIO - 1);
	skb->priority = HTB_MAJOR | (CLASS_MINOR_BASE + prio);
	if (eth->h_proto == bpf_htons(ETH_P_MAC_CONTROL))
		return TC_ACT_OK;	/* the daemon's wake-up frames: the far end consumes them uncounted */
	if (tagged(eth))
		in_id = (eth->h_source[2] << 8) | eth->h_source[3];
	struct port *in = in_id != NO_PORT ? bpf_map_lookup_elem(&ports, &in_id) : 0;
	if (!in)
		in_id = NO_PORT;

	int lossless = prio == PRIO_LOSSLESS && (out->flags & PORT_PFC);
	if (out->link_cut) {	/* lost on the cut cable; its buffer freed (see struct port) */
		if (lossless && in)
			credit_held(in, in_id, prio, len);
		__sync_fetch_and_add(&out->cut_drops, 1);
		return TC_ACT_STOLEN;
	}
	if (prio == PRIO_LOSSLESS && (out->wd_drop || out->peer_wd_drop)) {
		/* The PFC watchdog's drop action, on this queue (its peer storms: nothing more waits
		 * for it) or on the peer's ingress (counted there). */
		if (lossless && in)
			credit_held(in, in_id, prio, len);
		if (out->wd_drop) {
			__sync_fetch_and_add(&out->drops[prio], 1);
		} else {
			__u32 peer_id = (out->peer_wd_drop - 1) & (MAX_PORTS - 1);
			struct port *peer = bpf_map_lookup_elem(&ports, &peer_id);
			if (peer)
				__sync_fetch_and_add(&peer->rx_wd_drops, 1);
		}
		return TC_ACT_STOLEN;	/* see "Drops at egress" */
	}
	if (lossless && in) {
		/* Lossless admission is per ingress port; its bytes were charged on arrival
		 * (switch_ingress). The egress queue has no limit of its own (SONiC's lossless egress
		 * profile, dynamic_th 7 = infinite). The headroom is sized for the modelled pause
		 * response and cable (cc/headroom.py; a smaller one is refused), so a frame beyond
		 * xoff + headroom means the emulator, not the modelled link, was late to pause: it is
		 * admitted and counted (headroom_overruns; the run's fidelity check reports it), not
		 * dropped where the modelled switch would never have seen it. Only beyond the port's
		 * buffer is there no room: a lossless drop. */
		__u64 held = in->held[prio];
		if (held > in->limit[prio]) {
			credit_held(in, in_id, prio, len);
			__sync_fetch_and_add(&out->drops[prio], 1);
			__sync_fetch_and_add(&out->lossless_drops, 1);
			return TC_ACT_STOLEN;	/* see "Drops at egress" */
		}
		if (held > in->xoff + in->headroom)
			__sync_fetch_and_add(&in->headroom_overruns, 1);
	} else if (!lossless && out->queue[prio] + len > out->limit[prio]) {
		__sync_fetch_and_add(&out->drops[prio], 1);
		return TC_ACT_STOLEN;
	}

	if (lossless && in)
		pair_add(in_id, out_id, len, 0);
	__u64 depth = out->queue[prio];	/* the class's depth as this packet arrives */
	int mark = 0;
	__u16 old_word = 0, new_word = 0;
	if (ip && prio == PRIO_LOSSLESS && (out->flags & PORT_ECN)) {
		__u8 ecn = ip->tos & 3;
		if ((ecn == 1 || ecn == 2) && should_mark(out, depth)) {
			mark = 1;
			old_word = *(__u16 *)ip;	/* version/ihl + tos, as the checksum sees them */
			__u8 *bytes = (__u8 *)&new_word;
			bytes[0] = *(__u8 *)ip;
			bytes[1] = ip->tos | 3;
		}
	}
	__u8 charge = ip && prio == PRIO_LOSSLESS && ip->ttl > 1 ? MAC_CHARGE : 0;
	__u8 mac[6] = {TAG0, TAG1 | charge, in_id >> 8, in_id & 0xff, out_id >> 8, out_id & 0xff};

	__u64 queued = __sync_fetch_and_add(&out->queue[prio], len) + len;
	if (queued > out->max_queue[prio])
		out->max_queue[prio] = queued;
	__sync_fetch_and_add(&out->tx_packets[prio], 1);
	__sync_fetch_and_add(&out->tx_bytes[prio], len);

	/* Helpers that write the packet invalidate the pointers above: everything is read. */
	if (mark) {
		__u8 tos = ((__u8 *)&new_word)[1];
		bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old_word, new_word, 2);
		bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tos), &tos, 1, 0);
		__sync_fetch_and_add(&out->marked[prio], 1);
	}
	bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), mac, 6, 0);
	return TC_ACT_OK;
}

struct pfc_frame {
	__be16 opcode;
	__be16 vector;
	__be16 time[NPRIO];
} __attribute__((packed));

/* A frame a host sent still belongs to its socket until it is freed, and the send buffer each
 * queue pair's socket gets (nic/host_nic.py socket_budget) is meant to bound the frames waiting
 * in the host only: the NIC's own queue. On the userspace datapath Open vSwitch takes each frame
 * in by a packet socket, which frees it (the send buffer is credited) as the switch receives it.
 * On the kernel datapath nothing does: the frame crosses the switches and their egress queues
 * still charged to the sender's socket (veth keeps the reference across namespaces, for TCP's
 * small queues), so the sockets of the queue pairs feeding a queue fill up with what that queue
 * holds and stop their senders: an end-to-end flow control no fabric has, which held a 7:1
 * incast's queue at 7 x 6 frames and left PFC nothing to do. So at a switch port with
 * PORT_ORPHAN (the kernel datapath) a frame that still has a socket is given back to it here:
 * a clone (a clone has no socket) is sent back into this port's receive path, marked so that
 * its hand-off is not charged twice, and the frame itself is consumed. */
static __always_inline int orphan(struct __sk_buff *skb, __u32 ifindex)
{
	__u32 *idp = bpf_map_lookup_elem(&port_of_ifindex, &ifindex);
	struct port *me = idp ? bpf_map_lookup_elem(&ports, idp) : 0;

	if (!me || !(me->flags & PORT_ORPHAN))
		return -1;
	skb->mark = ORPHAN_MARK;
	if (bpf_clone_redirect(skb, ifindex, BPF_F_INGRESS)) {
		skb->mark = 0;
		return -1;	/* no clone: the frame goes on as it is */
	}
	return TC_ACT_STOLEN;	/* consumed, not dropped: no drop counter sees it */
}

/* A frame arrives at a link end: the bytes have left the upstream queue, so they are credited
 * back to it and to the ingress port they were charged to (XON when that port falls below
 * xon); PFC frames are consumed here and reported to the daemon. (A lossless frame entering a
 * switch was charged to its port before it got here: switch_arrival.) */
static __always_inline int ingress(struct __sk_buff *skb, int at_switch)
{
	pull_headers(skb);
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	__u32 len = skb->len, ifindex = skb->ifindex;
	struct port *from = 0;	/* the switch port that sent this frame, when it is tagged */
	__u32 from_id = NO_PORT;

	if ((void *)(eth + 1) > end)
		return TC_ACT_OK;
	if (at_switch && skb->mark == ORPHAN_MARK)
		skb->mark = 0;	/* orphan()'s clone, back: on as any frame */
	else if (at_switch && skb->sk && !tagged(eth) && eth->h_proto != bpf_htons(ETH_P_MAC_CONTROL)) {
		int r = orphan(skb, ifindex);
		if (r >= 0)
			return r;
		data = (void *)(long)skb->data;	/* a helper that may change the packet was called */
		end = (void *)(long)skb->data_end;
		eth = data;
		if ((void *)(eth + 1) > end)
			return TC_ACT_OK;
	}
	__u32 prio = prio_of(data, end, &ip) & (NPRIO - 1);
	if (tagged(eth)) {
		__u32 in_id = (eth->h_source[2] << 8) | eth->h_source[3];
		__u32 out_id = (eth->h_source[4] << 8) | eth->h_source[5];

		if (eth->h_proto == bpf_htons(ETH_P_MAC_CONTROL)) {
			/* A MAC control frame ends at the MAC: report PFC, never deliver. */
			struct pfc_frame *f = (void *)(eth + 1);
			if ((void *)(f + 1) <= end && f->opcode == bpf_htons(PFC_OPCODE))
				emit(bpf_map_lookup_elem(&ports, &out_id), EV_PFC_RX, out_id, bpf_ntohs(f->time[PRIO_LOSSLESS]), bpf_ntohs(f->vector), 0);
			return TC_ACT_SHOT;
		}
		from = credit_arrival(in_id, out_id, prio, len);
		from_id = out_id;
	}
	if (prio != PRIO_LOSSLESS)
		return TC_ACT_OK;
	if (!at_switch) {
		/* A NIC in a PFC storm has stopped draining: what still reaches it is lost. */
		if (from && from->peer_stalled) {
			__sync_fetch_and_add(&from->peer_drops, 1);
			return TC_ACT_SHOT;
		}
		if (from && from->nic_rx_rate)
			return nic_receive(from, from_id, len);
		return TC_ACT_OK;
	}
	__u32 *idp = bpf_map_lookup_elem(&port_of_ifindex, &ifindex);
	if (!idp)
		return TC_ACT_OK;
	__u32 me_id = *idp;
	struct port *me = bpf_map_lookup_elem(&ports, &me_id);
	if (!me)
		return TC_ACT_OK;
	if (me->wd_status)	/* SONiC's RX counters count only while the queue is stormed */
		__sync_fetch_and_add(&me->rx_lossless, 1);
	if (!(me->flags & PORT_PFC))
		return TC_ACT_OK;
	/* An IPv4 packet with no TTL left to forward dies in the switch's table 0 (a router's TTL
	 * expiry, controller/core.py), in Open vSwitch, where no program could give its bytes back:
	 * it takes no buffer, as in a switch that drops it before admission. */
	if (ip && ip->ttl <= 1)
		return TC_ACT_OK;
	__u32 due = len - take_handed_over(me, len);
	if (due) {
		__sync_fetch_and_add(&me->ingress_charges, 1);
		charge(me, me_id, due);
	}
	return TC_ACT_OK;
}

SEC("tc")
int switch_ingress(struct __sk_buff *skb)
{
	return ingress(skb, 1);
}

/* Host NICs live in their own namespaces, where an ifindex may equal a switch port's. */
SEC("tc")
int host_ingress(struct __sk_buff *skb)
{
	return ingress(skb, 0);
}

/* Charging at the hand-off. A switch accounts its buffer from arrival, and the frame that
 * crosses xoff pauses the upstream. Here a frame a veth hands to a switch port is not yet at the
 * port's tc ingress: the kernel puts it in the receive backlog of the CPU that receive steering
 * picked for its flow (kernel/rps.py), and if the hypervisor holds that CPU for ~10 ms while the
 * sender's runs on, what was sent meanwhile arrives at once, uncharged till then, and past the
 * headroom however fast the pause that follows. So switch_arrival charges a lossless frame where
 * the veth hands it over (tracepoint net:netif_rx, before the backlog), on the sending CPU: a
 * frame not yet taken in counts as in the switch, as one in Open vSwitch's receive queue already
 * did, and its XOFF crossing is seen (and the upstream's gate closed: responder.c) while the
 * sender runs.
 *
 * Which frames: the sender's egress program marks a lossless IPv4 frame with TTL left to forward
 * (MAC_CHARGE, constant per flow, so Open vSwitch's exact-match cache still hits), since the IP
 * header of a large frame is not in the part of the skb a tracing program can read.
 *
 * Each frame charged once: what switch_arrival charged goes into the port's `handed_over` too,
 * and the tc ingress charges each lossless frame's length less what it takes from there. This
 * kernel skips a tracepoint call now and then (a few frames in ten thousand, with no recursion
 * miss counted), and frames from another machine carry no mark: those are charged at the tc
 * ingress. A frame may take bytes another handed over (the skipped one arriving first); the one
 * that then finds too few charges the rest, so the total is exact once both are in: what is
 * handed over is never more than the frames handed over and not yet taken in.
 *
 * Which ports: this run's switch ports (port_of_ifindex) in the one network namespace they all
 * live in (switch_netns; other namespaces reuse ifindexes). Every run's program sees every frame
 * the machine's veths hand over: a few hundred nanoseconds a frame here. */
struct ns_common___fe { unsigned int inum; } __attribute__((preserve_access_index));
struct net___fe { struct ns_common___fe ns; } __attribute__((preserve_access_index));
struct net_device___fe {
	int ifindex;
	struct { struct net___fe *net; } nd_net;
} __attribute__((preserve_access_index));
struct sk_buff___fe {
	struct net_device___fe *dev;
	unsigned int len;
	__u16 protocol, mac_header;
	__u32 mark;
	unsigned char *head, *data;
} __attribute__((preserve_access_index));
enum skb_drop_reason___fe { SKB_DROP_REASON_CPU_BACKLOG___fe = 0, SKB_DROP_REASON_DEV_READY___fe = 1 };

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);	/* the inode number of the switch ports' network namespace */
} switch_netns SEC(".maps");

/* The switch port a marked frame is handed to, and the frame's length as the tc programs count
 * it (skb->len there includes the Ethernet header, which the kernel has pulled here). */
static __always_inline struct port *arrival_port(struct sk_buff___fe *skb, __u32 *id, __u32 *len)
{
	struct ethhdr eth;
	__u32 zero = 0;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return 0;
	unsigned char *mac = skb->head + skb->mac_header;
	if (bpf_probe_read_kernel(&eth, sizeof(eth), mac) || !marked_to_charge(eth.h_source))
		return 0;
	__u32 *netns = bpf_map_lookup_elem(&switch_netns, &zero);
	struct net_device___fe *dev = skb->dev;
	if (!netns || !dev || dev->nd_net.net->ns.inum != *netns)
		return 0;
	__u32 ifindex = dev->ifindex;
	__u32 *idp = bpf_map_lookup_elem(&port_of_ifindex, &ifindex);
	if (!idp)
		return 0;
	*id = *idp;
	struct port *me = bpf_map_lookup_elem(&ports, id);
	if (!me || !(me->flags & PORT_PFC))
		return 0;
	*len = skb->len + (__u32)(skb->data - mac);
	return me;
}

SEC("tp_btf/netif_rx")
int BPF_PROG(switch_arrival, struct sk_buff___fe *skb)
{
	__u32 me_id, len;
	struct port *me = skb->mark != ORPHAN_MARK ? arrival_port(skb, &me_id, &len) : 0;

	if (!me)
		return 0;	/* (orphan()'s clone was charged as the frame it copies) */
	__sync_fetch_and_add(&me->handed_over, len);
	__sync_fetch_and_add(&me->handoff_charges, 1);
	charge(me, me_id, len);
	return 0;
}

/* A frame dropped after its charge, before the switch got it (a full receive backlog, or the
 * port going down meanwhile: enqueue_to_backlog), never reaches the egress that would have
 * given its bytes back: give them back here. */
SEC("tp_btf/kfree_skb")
int BPF_PROG(switch_arrival_dropped, struct sk_buff___fe *skb, void *location, enum skb_drop_reason___fe reason)
{
	__u32 me_id, len;

	/* (Each reason where this kernel has it: a relocation it cannot make would fail the load.) */
	int backlog = bpf_core_enum_value_exists(enum skb_drop_reason___fe, SKB_DROP_REASON_CPU_BACKLOG___fe) &&
		      reason == bpf_core_enum_value(enum skb_drop_reason___fe, SKB_DROP_REASON_CPU_BACKLOG___fe);
	int down = bpf_core_enum_value_exists(enum skb_drop_reason___fe, SKB_DROP_REASON_DEV_READY___fe) &&
		   reason == bpf_core_enum_value(enum skb_drop_reason___fe, SKB_DROP_REASON_DEV_READY___fe);
	if (!backlog && !down)
		return 0;
	struct port *me = arrival_port(skb, &me_id, &len);
	if (me && take_handed_over(me, len) == len) {
		__sync_fetch_and_sub(&me->handoff_charges, 1);
		credit_held(me, me_id, PRIO_LOSSLESS, len);
	}
	return 0;
}

/* The flowlet stage: the uplink (index) for this packet, or -1 to leave it to the routes. */
static __always_inline int dlb_uplink(struct iphdr *ip, struct udphdr *udp, __u32 len)
{
	__u32 src_leaf = ((__u8 *)&ip->saddr)[2], dst_leaf = ((__u8 *)&ip->daddr)[2];
	struct dlb_leaf *leaf = bpf_map_lookup_elem(&dlb, &src_leaf);

	if (!leaf || !leaf->enabled || src_leaf == dst_leaf)
		return -1;
	__u64 now = bpf_ktime_get_ns(), allowed = leaf->allowed[dst_leaf & (DLB_MAX_LEAVES - 1)];
	__u32 n = leaf->n_uplinks;
	struct flow_key key = {ip->saddr, ip->daddr, udp->source, udp->dest};
	struct flowlet *f = bpf_map_lookup_elem(&flowlets, &key);
	__u32 up;

	if (f && now - f->last_ns < leaf->inactivity_ns && f->uplink < DLB_MAX_UPLINKS &&
	    (allowed >> f->uplink & 1)) {
		up = f->uplink;	/* within a flowlet: the path stays */
	} else {
		if (now - leaf->window_start >= leaf->window_ns) {	/* a new quality window */
			leaf->window_start = now;
			for (int i = 0; i < DLB_MAX_UPLINKS; i++) {
				leaf->bytes_prev[i] = leaf->bytes_cur[i];
				leaf->bytes_cur[i] = 0;
			}
		}
		__u64 best = ~0ULL;
		/* Ties (equal loads: flowlets that start at once, before either is counted, on two
		 * CPUs) go round-robin: each new flowlet starts its search one uplink further. */
		__u32 first = (__u32)__sync_fetch_and_add(&leaf->next_start, 1);
		up = DLB_MAX_UPLINKS;
		for (int k = 0; k < DLB_MAX_UPLINKS; k++) {
			if (k >= n)
				break;
			__u32 i = (first + k) % n & (DLB_MAX_UPLINKS - 1);
			if (!(allowed >> i & 1))
				continue;
			__u64 load = leaf->bytes_cur[i] + leaf->bytes_prev[i];
			if (load < best) {
				best = load;
				up = i;
			}
		}
		if (up >= DLB_MAX_UPLINKS)
			return -1;	/* no uplink reaches the destination */
		__sync_fetch_and_add(&leaf->flowlets[up], 1);
		if (f && f->uplink != up)
			__sync_fetch_and_add(&leaf->moves[up], 1);
		struct flowlet nf = {.last_ns = now, .uplink = up};
		bpf_map_update_elem(&flowlets, &key, &nf, BPF_ANY);
		f = 0;
	}
	if (f)
		f->last_ns = now;
	__sync_fetch_and_add(&leaf->bytes_cur[up & (DLB_MAX_UPLINKS - 1)], len);
	__sync_fetch_and_add(&leaf->packets[up & (DLB_MAX_UPLINKS - 1)], 1);
	__sync_fetch_and_add(&leaf->bytes[up & (DLB_MAX_UPLINKS - 1)], len);
	return up;
}

SEC("tc")
int host_egress(struct __sk_buff *skb)
{
	__u32 need = sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr);

	if (skb->data + need > skb->data_end && skb->len >= need)
		bpf_skb_pull_data(skb, need);
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct iphdr *ip;

	if (data + sizeof(struct ethhdr) > end)
		return TC_ACT_OK;
	__u32 prio = prio_of(data, end, &ip) & (NPRIO - 1);
	skb->priority = HTB_MAJOR | (CLASS_MINOR_BASE + prio);
	struct ethhdr *eth = data;
	if (ip && prio == PRIO_LOSSLESS && ip->ttl > 1 && eth->h_source[0] == UNTAG0 && eth->h_source[1] == TAG1) {
		__u8 src1 = TAG1 | MAC_CHARGE;	/* the leaf charges it on hand-over: switch_arrival */
		bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source) + 1, &src1, 1, 0);
		data = (void *)(long)skb->data;	/* the store invalidated every packet pointer */
		end = (void *)(long)skb->data_end;
		prio_of(data, end, &ip);
	}
	if (!ip || ip->protocol != IPPROTO_UDP || ip->ihl != 5)
		return TC_ACT_OK;
	struct udphdr *udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end || udp->dest != bpf_htons(ROCE_PORT))
		return TC_ACT_OK;
	int up = dlb_uplink(ip, udp, skb->len);
	if (up < 0)
		return TC_ACT_OK;
	/* TTL and protocol share a checksummed 16-bit word. */
	__u16 old_word = *(__u16 *)&ip->ttl, new_word = old_word;
	((__u8 *)&new_word)[0] = DLB_TTL_BASE + up;
	__u8 ttl = DLB_TTL_BASE + up;
	bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old_word, new_word, 2);
	bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, ttl), &ttl, 1, 0);
	return TC_ACT_OK;
}

/* Direct action on HTB 30:, attached with classid 30:0 (it must be: see below). cls_bpf presets
 * skb->tc_classid to the filter's classid, runs the program and hands HTB
 * TC_H_MAJ(filter classid) | tc_classid; and tc_classid is 16 bits (qdisc_skb_cb; the verifier
 * turns the store into a 16-bit one), so the program can only choose the minor. An unmarked
 * packet comes out as 30:0, which HTB takes as "direct queue"; a marked one as 30:<mark>. A mark
 * with no class (yet) falls back to HTB's default, 0: direct too. With classid 0 every packet
 * would come out as 0:<mark>, no class of HTB 30:, and go direct (measured).
 * skb->mark is the socket's SO_MARK; veth scrubs it on the way to the switch's namespace. */
SEC("tc")
int qp_classify(struct __sk_buff *skb)
{
	__u32 mark = skb->mark;

	if (mark >= QP_MINOR_BASE && mark <= 0xffff)
		skb->tc_classid = mark;
	return TC_ACT_OK;
}

/* Cross-machine links (issue 19). A link between two machines is, on each machine, the switch
 * port's veth whose peer is a "stitch" end, and a VXLAN device per link to the other machine
 * (fabric_emu/kernel/vxlan.py; no Linux bridge: it drops 01:80:c2:00:00:01, PFC frames). Each
 * machine has its own `ports` map holding only its own ports (port ids are global), so:
 *
 *   stitch_out     the stitch end, ingress (frames leaving this machine): a tagged data frame
 *                  "arrives" as it leaves the machine (the underlay's time is not modelled; the
 *                  issue's preflight bounds it), so the far end's credits are made here, where
 *                  the sender's entries live, as ingress() does; then the tag is cleared, lest
 *                  the other machine credit entries it does not own. MAC control (PFC) frames
 *                  keep their tag: it carries the pausing port's global id. Either way the frame
 *                  goes out of the link's VXLAN device.
 *   stitch_in      the VXLAN device, ingress (frames from the other machine): out of the stitch
 *                  end, so they reach the switch port's ingress as over a local link.
 *
 * Where each goes: ifindex -> ifindex (stitch end -> VXLAN device and back), per link, filled
 * by fabric_emu.ports.datapath.attach_stitch. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PORTS);
	__type(key, __u32);
	__type(value, __u32);
} stitch_peer SEC(".maps");


SEC("tc")
int stitch_out(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex, len = skb->len;
	__u32 *to = bpf_map_lookup_elem(&stitch_peer, &ifindex);

	if (!to)
		return TC_ACT_SHOT;	/* a stitch end without its tunnel: nowhere to go */
	__u32 target = *to;
	pull_headers(skb);
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;

	if ((void *)(eth + 1) > end || eth->h_proto == bpf_htons(ETH_P_MAC_CONTROL) ||
	    !tagged(eth))
		return bpf_redirect(target, 0);
	__u32 prio = prio_of(data, end, &ip) & (NPRIO - 1);
	__u32 in_id = (eth->h_source[2] << 8) | eth->h_source[3];
	__u32 out_id = (eth->h_source[4] << 8) | eth->h_source[5];
	credit_arrival(in_id, out_id, prio, len);
	__u8 untag[2] = {UNTAG0, UNTAG1 | (eth->h_source[1] & MAC_CHARGE)};	/* the far switch charges it */
	bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), untag, 2, 0);
	return bpf_redirect(target, 0);
}

SEC("tc")
int stitch_in(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	__u32 *to = bpf_map_lookup_elem(&stitch_peer, &ifindex);

	return to ? bpf_redirect(*to, 0) : TC_ACT_SHOT;
}

/* What a cut link lost after Open vSwitch had sent it: frames in the port's egress queue (the
 * kernel purges a queue whose carrier went) or on the wire as it went down. They left no trace
 * but the pairs they were charged to. Attached nowhere: once a cut port's queue is empty,
 * fabric_emu/ports/runtime.py runs it (BPF_PROG_TEST_RUN) for each (ingress, egress) pair the
 * port still holds, with those bytes after an Ethernet header, and it credits them as an
 * arrival at the far end would have (XON included), so no ingress stays charged for good. */
struct give_back_args {
	__u32 in_id, out_id, len;
};

SEC("tc")
int give_back(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct give_back_args *a = data + ETH_HLEN;

	if ((void *)(a + 1) > end)
		return TC_ACT_SHOT;
	return credit_arrival(a->in_id, a->out_id, PRIO_LOSSLESS, a->len) ? TC_ACT_OK : TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "GPL";
