/* The PFC responder: the one process that switches a run's PFC gates (fabric_emu/ports/responder.py
 * starts it as a child of the PFC daemon, fabric_emu/ports/pfcd.py).
 *
 * Why: a pause waited for the daemon, one Python process, to be scheduled, and on a virtual
 * machine the CPU it was queued on was sometimes not run for milliseconds while the other CPU was
 * free (docs/lossless-ports.md#headroom). Here one real-time thread per CPU (up to eight, spread
 * over them) waits for the same work, and whichever runs first does it:
 *
 * - an XOFF crossing (the port programs' `fast` ring buffer) on a switch port whose upstream is on
 *   this machine closes that upstream's gate at once, as its MAC would on the pause frame (the
 *   daemon still sends the frame, times the pause and refreshes it);
 * - every other gate change is the daemon's, sent here as a command and applied in the same way.
 *
 * Two writers of one gate could undo each other: a close delayed past the daemon's reopening
 * would leave the gate shut. So each change carries its cause, the time of the latest port
 * program event it reflects (an XOFF crossing: its own time; a daemon command: the latest event
 * the daemon had read), and a gate takes a change only if no change with a later cause, or with
 * the same cause from the daemon (who knew that event), was applied before it. Daemon commands
 * also carry a sequence number, so two threads that read two of them never apply them out of
 * order. Each change made, and each refused, is reported back to the daemon, which keeps
 * the books (pause intervals, reaction times, the watchdog's view).
 *
 * Usage: responder CONFIG PARENT_PID; the config's lines are `pins DIR`, `sock FD`, `priority N`,
 * `ns I PATH`, `gate ID NS IFINDEX OPEN_HEX CLOSE_HEX KICK_HEX`, `fast XOFF_PORT GATE`, and the
 * byte offsets in struct port (bpf/port.c) of what it reads and writes: `ports STRIDE LINK_CUT
 * PAUSED_SINCE PAUSED_NS` (the last two of the lossless class). Prints READY when serving.
 *
 * It keeps each gate's paused_since and paused_ns in the ports map as it switches the gate, so
 * the map always says which gates are closed: a daemon that died is replaced, and the gates it
 * held closed reopened, from the map (fabric_emu/ports/runtime.py, recover_daemon). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/if_packet.h>
#include <linux/netlink.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_PORTS 4096 /* layout.py MAX_PORTS */
#define MAX_NS 4096
#define MAX_WORKERS 8 /* spread over the CPUs: each crossing wakes them all */
#define MAX_MSG 2048 /* a TBF change with its rate table: ~1.1 KB */
#define EV_XOFF 1
#define RB_BUSY (1U << 31)
#define RB_DISCARD (1U << 30)
#define RB_HDR 8

enum { OP_CLOSE = 0, OP_OPEN = 1, OP_FAST_OFF = 2, OP_FAST_ON = 3 };
enum { SRC_DAEMON = 0, SRC_FAST = 1 };

struct event { /* struct event of bpf/port.c */
	uint64_t time_ns;
	uint32_t type, port, quanta, vector;
	uint64_t bytes;
};

struct command { /* responder.py COMMAND */
	uint32_t op, port;
	uint64_t cause, seq, origin, handled;
};

struct report { /* responder.py REPORT */
	uint32_t port;
	uint8_t open, source, changed, stale;
	int32_t error;
	uint32_t pad;
	uint64_t cause, origin, handled, start_ns, applied_ns, kick_ns;
};

struct gate {
	pthread_mutex_t lock;
	int known, ns, ifindex, fast_on;
	int open;		/* as last set here; every gate starts open */
	uint64_t last_cause;	/* of the change applied last */
	uint64_t last_seq;	/* of the daemon's gate command applied last */
	uint64_t fast_seq;	/* of the daemon's command that set fast_on last (this port's XOFFs) */
	unsigned char msg[2][MAX_MSG];	/* [open]: the pre-encoded tc change */
	size_t len[2];
	unsigned char kick[60];
};

static struct gate gates[MAX_PORTS];
static int fast_gate[MAX_PORTS]; /* XOFF port -> the gate it closes, -1: none */
static int nsfd[MAX_NS], n_ns, kick_sock[MAX_NS];
static int sock = -1, priority = 11, ring_fd = -1, ports_fd = -1;
static size_t stride, cut_offset, since_offset, paused_offset;
static volatile unsigned char *ports_mem;
static volatile uint64_t *cons_pos;
static const volatile uint64_t *prod_pos;
static const unsigned char *ring_data;
static uint64_t ring_mask, claim;
static int n_workers;

struct worker {
	int cpu, epfd;
	int nl[MAX_NS]; /* its own rtnetlink socket in each namespace: acks are never mixed up */
	pthread_t thread;
};
static struct worker workers[MAX_WORKERS];

static void die(const char *what)
{
	fprintf(stderr, "responder: %s: %s\n", what, strerror(errno));
	exit(1);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts); /* bpf_ktime_get_ns's clock */
	return (uint64_t)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static int obj_get(const char *path)
{
	union bpf_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.pathname = (uint64_t)(unsigned long)path;
	return syscall(__NR_bpf, BPF_OBJ_GET, &attr, sizeof attr);
}

static uint32_t map_max_entries(int fd)
{
	struct bpf_map_info info;
	union bpf_attr attr;
	memset(&info, 0, sizeof info);
	memset(&attr, 0, sizeof attr);
	attr.info.bpf_fd = fd;
	attr.info.info_len = sizeof info;
	attr.info.info = (uint64_t)(unsigned long)&info;
	if (syscall(__NR_bpf, BPF_OBJ_GET_INFO_BY_FD, &attr, sizeof attr))
		die("map info");
	return info.max_entries;
}

static size_t unhex(const char *s, unsigned char *out, size_t max)
{
	size_t n = strlen(s) / 2;
	if (n > max) {
		fprintf(stderr, "responder: message too long\n");
		exit(1);
	}
	for (size_t i = 0; i < n; i++)
		sscanf(s + 2 * i, "%2hhx", &out[i]);
	return n;
}

static void open_maps(const char *pins)
{
	char path[4096];
	long page = sysconf(_SC_PAGESIZE);
	snprintf(path, sizeof path, "%s/maps/fast", pins);
	ring_fd = obj_get(path);
	if (ring_fd < 0)
		die(path);
	uint64_t size = map_max_entries(ring_fd);
	ring_mask = size - 1;
	cons_pos = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd, 0);
	void *prod = mmap(NULL, page + 2 * size, PROT_READ, MAP_SHARED, ring_fd, page);
	if (cons_pos == MAP_FAILED || prod == MAP_FAILED)
		die("mmap fast ring");
	prod_pos = prod;
	ring_data = (const unsigned char *)prod + page;
	claim = *cons_pos;
	snprintf(path, sizeof path, "%s/maps/ports", pins);
	ports_fd = obj_get(path);
	if (ports_fd < 0)
		die(path);
	ports_mem = mmap(NULL, (size_t)MAX_PORTS * stride, PROT_READ | PROT_WRITE, MAP_SHARED, ports_fd, 0);
	if (ports_mem == MAP_FAILED)
		die("mmap ports");
}

static void read_config(const char *file)
{
	FILE *f = fopen(file, "r");
	static char line[16384], a[4096], b[MAX_MSG * 2 + 1], c[MAX_MSG * 2 + 1], d[256], pins[4096] = "";
	int id, ns, ifindex;
	if (!f)
		die(file);
	for (int i = 0; i < MAX_PORTS; i++)
		fast_gate[i] = -1;
	while (fgets(line, sizeof line, f)) {
		if (sscanf(line, "pins %4095s", pins) == 1)
			continue;
		if (sscanf(line, "sock %d", &sock) == 1 || sscanf(line, "priority %d", &priority) == 1)
			continue;
		if (sscanf(line, "ports %zu %zu %zu %zu", &stride, &cut_offset, &since_offset, &paused_offset) == 4)
			continue;
		if (sscanf(line, "ns %d %4095s", &id, a) == 2 && id >= 0 && id < MAX_NS) {
			nsfd[id] = open(a, O_RDONLY | O_CLOEXEC);
			if (nsfd[id] < 0)
				die(a);
			n_ns = id + 1 > n_ns ? id + 1 : n_ns;
			continue;
		}
		if (sscanf(line, "gate %d %d %d %4096s %4096s %255s", &id, &ns, &ifindex, b, c, d) == 6 &&
		    id >= 0 && id < MAX_PORTS && ns >= 0 && ns < MAX_NS) {
			struct gate *g = &gates[id];
			g->known = 1;
			g->ns = ns;
			g->ifindex = ifindex;
			g->open = 1;
			g->len[1] = unhex(b, g->msg[1], MAX_MSG);
			g->len[0] = unhex(c, g->msg[0], MAX_MSG);
			unhex(d, g->kick, sizeof g->kick);
			continue;
		}
		if (sscanf(line, "fast %d %d", &id, &ns) == 2 && id >= 0 && id < MAX_PORTS && ns >= 0 &&
		    ns < MAX_PORTS) {
			fast_gate[id] = ns;
			gates[id].fast_on = 1;
			continue;
		}
		fprintf(stderr, "responder: bad config line: %s", line);
		exit(1);
	}
	fclose(f);
	if (sock < 0 || !pins[0] || !stride) {
		fprintf(stderr, "responder: config lacks sock, pins or ports\n");
		exit(1);
	}
	for (int i = 0; i < MAX_PORTS; i++)
		pthread_mutex_init(&gates[i].lock, NULL);
	open_maps(pins);
}

/* Each worker's rtnetlink sockets, and one packet socket per namespace for the kicks: made
 * here, by this one thread switching namespaces, before any worker runs. */
static void open_sockets(void)
{
	int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
	for (int i = 0; i < n_ns; i++) {
		if (setns(nsfd[i], CLONE_NEWNET))
			die("setns");
		for (int w = 0; w < n_workers; w++) {
			struct sockaddr_nl sa = {.nl_family = AF_NETLINK};
			int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
			if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof sa))
				die("netlink socket");
			workers[w].nl[i] = s;
		}
		kick_sock[i] = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
		if (kick_sock[i] < 0)
			die("packet socket");
	}
	if (setns(home, CLONE_NEWNET))
		die("setns home");
	close(home);
}

static int tc_change(int nl, const unsigned char *msg, size_t len)
{
	unsigned char ack[1024];
	if (send(nl, msg, len, 0) < 0)
		return -errno;
	ssize_t n = recv(nl, ack, sizeof ack, 0);
	if (n < 0)
		return -errno;
	if (n < (ssize_t)(sizeof(struct nlmsghdr) + sizeof(int)))
		return -EPROTO;
	int error;
	memcpy(&error, ack + sizeof(struct nlmsghdr), sizeof error);
	return error;
}

static void kick(struct gate *g)
{
	/* A closed TBF is not rescheduled by a change: a frame through the port's qdisc restarts it
	 * (the reserved MAC control opcode 0, consumed by the peer's program: pfcd.py's KICK). */
	struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_ifindex = g->ifindex};
	sendto(kick_sock[g->ns], g->kick, sizeof g->kick, 0, (struct sockaddr *)&sll, sizeof sll);
}

/* Whether a gate whose last change had cause last_cause (and whose last daemon command was
 * last_seq) takes a change: a fast close needs a later cause (the daemon's changes at the same
 * cause knew of its crossing); a daemon command, the same cause or later, and a later sequence.
 * Not static: tests/unit/test_responder.py calls it. */
int responder_admits(uint64_t last_cause, uint64_t last_seq, int source, uint64_t cause, uint64_t seq)
{
	if (cause < last_cause || (cause == last_cause && source == SRC_FAST))
		return 0;
	return source == SRC_FAST || seq > last_seq;
}

static volatile uint64_t *port_word(uint32_t id, size_t offset)
{
	return (volatile uint64_t *)(ports_mem + id * stride + offset);
}

/* The gate's books in the map, as the daemon's own close() and recover_daemon read them. */
static void keep_books(uint32_t id, int open, uint64_t at)
{
	volatile uint64_t *since = port_word(id, since_offset);
	if (!open) {
		*since = at;
	} else if (*since) {
		*port_word(id, paused_offset) += at - *since;
		*since = 0;
	}
}

static void apply(struct worker *w, uint32_t id, int open, int source, uint64_t cause, uint64_t seq,
		  uint64_t origin, uint64_t handled)
{
	struct gate *g = &gates[id];
	struct report r = {.port = id, .open = open, .source = source, .cause = cause, .origin = origin,
			   .handled = handled};
	pthread_mutex_lock(&g->lock);
	if (!responder_admits(g->last_cause, g->last_seq, source, cause, seq)) {
		r.stale = 1;
	} else {
		g->last_cause = cause;
		if (source == SRC_DAEMON)
			g->last_seq = seq;
		if (g->open != open) {
			r.start_ns = now_ns();
			r.error = tc_change(w->nl[g->ns], g->msg[open], g->len[open]);
			r.applied_ns = now_ns();
			if (!r.error) {
				g->open = open;
				r.changed = 1;
				keep_books(id, open, r.applied_ns);
				if (open) {
					kick(g);
					r.kick_ns = now_ns() - r.applied_ns;
				}
			}
		}
	}
	/* In order, under the gate's lock; a change that was already so goes unreported (the
	 * daemon's socket holds a few hundred reports while it is away). */
	if ((r.changed || r.stale || r.error) && send(sock, &r, sizeof r, 0) < 0 && errno != EINTR)
		exit(0); /* the daemon is gone */
	pthread_mutex_unlock(&g->lock);
}

static void set_fast(uint32_t id, int on, uint64_t seq)
{
	struct gate *g = &gates[id];
	pthread_mutex_lock(&g->lock);
	if (seq > g->fast_seq) {
		__atomic_store_n(&g->fast_on, on, __ATOMIC_RELEASE);
		g->fast_seq = seq;
	}
	pthread_mutex_unlock(&g->lock);
}

static void on_event(struct worker *w, const struct event *ev)
{
	if (ev->type != EV_XOFF || ev->port >= MAX_PORTS || fast_gate[ev->port] < 0)
		return;
	if (!__atomic_load_n(&gates[ev->port].fast_on, __ATOMIC_ACQUIRE))
		return; /* the watchdog holds this port or its upstream */
	if (*port_word(ev->port, cut_offset))
		return; /* a cut link carries no pause frame */
	apply(w, fast_gate[ev->port], 0, SRC_FAST, ev->time_ns, 0, ev->time_ns, now_ns());
}

/* Records are claimed lock-free (each worker copies one, then claims it by compare-and-swap),
 * so a worker stalled mid-drain holds no lock the others need. */
static int drain_ring(struct worker *w)
{
	int busy = 0;
	for (;;) {
		uint64_t c = __atomic_load_n(&claim, __ATOMIC_ACQUIRE);
		uint64_t prod = __atomic_load_n(prod_pos, __ATOMIC_ACQUIRE);
		if (c >= prod)
			break;
		const unsigned char *at = ring_data + (c & ring_mask);
		uint32_t hdr = __atomic_load_n((const uint32_t *)at, __ATOMIC_ACQUIRE);
		if (hdr & RB_BUSY) {
			busy = 1;
			break;
		}
		uint32_t len = hdr & ~(RB_BUSY | RB_DISCARD);
		struct event ev;
		memcpy(&ev, at + RB_HDR, sizeof ev);
		uint64_t next = c + ((len + RB_HDR + 7) & ~7U);
		if (!__atomic_compare_exchange_n(&claim, &c, next, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			continue;
		if (!(hdr & RB_DISCARD) && len >= sizeof ev)
			on_event(w, &ev);
	}
	/* Consumed up to every claim, so the ring reads empty once all are taken. */
	uint64_t c = __atomic_load_n(&claim, __ATOMIC_ACQUIRE), old = *cons_pos;
	while (old < c && !__atomic_compare_exchange_n(cons_pos, &old, c, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
		;
	return busy;
}

static void drain_commands(struct worker *w)
{
	struct command cmd;
	for (;;) {
		ssize_t n = recv(sock, &cmd, sizeof cmd, MSG_DONTWAIT);
		if (n == 0)
			exit(0); /* the daemon closed its end */
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return;
			exit(0);
		}
		if (n != sizeof cmd || cmd.port >= MAX_PORTS || !gates[cmd.port].known)
			continue;
		if (cmd.op == OP_CLOSE || cmd.op == OP_OPEN)
			apply(w, cmd.port, cmd.op == OP_OPEN, SRC_DAEMON, cmd.cause, cmd.seq, cmd.origin, cmd.handled);
		else if (cmd.op == OP_FAST_OFF || cmd.op == OP_FAST_ON)
			set_fast(cmd.port, cmd.op == OP_FAST_ON, cmd.seq);
	}
}

static void *serve(void *arg)
{
	struct worker *w = arg;
	struct epoll_event evs[4];
	for (;;) {
		int n = epoll_wait(w->epfd, evs, 4, -1);
		if (n < 0 && errno != EINTR)
			die("epoll_wait");
		for (int i = 0; i < n; i++)
			if (evs[i].events & (EPOLLHUP | EPOLLERR) && evs[i].data.fd == sock)
				exit(0);
		drain_commands(w);
		if (drain_ring(w)) {
			struct timespec ts = {0, 20000}; /* a record still being written: its commit is near */
			nanosleep(&ts, NULL);
		}
	}
	return NULL;
}

#ifndef RESPONDER_LIB /* tests/unit/test_responder.py builds the rest as a library */
int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: responder CONFIG PARENT_PID\n");
		return 2;
	}
	prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives its daemon, even a kill -9'd one */
	if (getppid() != atoi(argv[2]))
		return 0;
	read_config(argv[1]);
	cpu_set_t cpus;
	if (sched_getaffinity(0, sizeof cpus, &cpus))
		die("sched_getaffinity");
	int n_cpus = CPU_COUNT(&cpus), every = (n_cpus + MAX_WORKERS - 1) / MAX_WORKERS, seen = 0;
	for (int cpu = 0; cpu < CPU_SETSIZE && n_workers < MAX_WORKERS; cpu++)
		if (CPU_ISSET(cpu, &cpus) && seen++ % every == 0)
			workers[n_workers++].cpu = cpu;
	/* A socket per worker and namespace (a host's each): more than the default 1,024 fds on a
	 * large fabric. */
	struct rlimit nofile;
	if (!getrlimit(RLIMIT_NOFILE, &nofile)) {
		nofile.rlim_cur = nofile.rlim_max;
		setrlimit(RLIMIT_NOFILE, &nofile);
	}
	open_sockets();
	int rt = 1;
	for (int i = 0; i < n_workers; i++) {
		struct worker *w = &workers[i];
		w->epfd = epoll_create1(EPOLL_CLOEXEC);
		struct epoll_event e1 = {.events = EPOLLIN, .data.fd = ring_fd};
		struct epoll_event e2 = {.events = EPOLLIN, .data.fd = sock};
		if (w->epfd < 0 || epoll_ctl(w->epfd, EPOLL_CTL_ADD, ring_fd, &e1) ||
		    epoll_ctl(w->epfd, EPOLL_CTL_ADD, sock, &e2))
			die("epoll");
		pthread_attr_t attr;
		cpu_set_t one;
		CPU_ZERO(&one);
		CPU_SET(w->cpu, &one);
		pthread_attr_init(&attr);
		pthread_attr_setaffinity_np(&attr, sizeof one, &one);
		struct sched_param sp = {.sched_priority = priority};
		pthread_attr_setinheritsched(&attr, PTHREAD_EXPLICIT_SCHED);
		pthread_attr_setschedpolicy(&attr, SCHED_FIFO);
		pthread_attr_setschedparam(&attr, &sp);
		int err = pthread_create(&w->thread, &attr, serve, w);
		if (err == EPERM) { /* no real-time priority here: serve all the same */
			rt = 0;
			pthread_attr_setinheritsched(&attr, PTHREAD_INHERIT_SCHED);
			err = pthread_create(&w->thread, &attr, serve, w);
		}
		if (err) {
			errno = err;
			die("pthread_create");
		}
		pthread_attr_destroy(&attr);
	}
	if (!rt)
		fprintf(stderr, "responder: warning: no real-time priority; pauses may take effect late\n");
	printf("READY %d\n", n_workers);
	fflush(stdout);
	for (;;)
		pause();
}
#endif
