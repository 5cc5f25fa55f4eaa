// The NIC engine's per-packet work, in C: building and sending runs of RC WRITE packets
// (sendmmsg), and receiving and parsing packets in batches (recvmmsg).
//
// Python keeps every decision (the go-back-N requester, the responder, DCQCN, the rates);
// this file only moves bytes. It is compiled on first use (fabric_emu/nic/fastpath.py) and
// called through ctypes, one call per run of packets, not per packet.
//
// Send: a packet is [header | zero data and pad | ICRC]. The header (BTH, plus the RETH on
// WRITE FIRST/ONLY) and the ICRC differ per packet; the data is zeros shared by all, so each
// packet is three iovecs and nothing is copied here. The ICRC is incremental: the template's
// CRC (PSN 0, AckReq clear, DMA length 0) XOR one table entry per changed byte, as in
// fabric_emu.wire.roce.QpPackets, whose tables Python hands over.
//
// Receive: up to FE_RX_BATCH datagrams per recvmmsg, only their first FE_RX_HEAD bytes copied
// (MSG_TRUNC still reports each datagram's full length). Consecutive in-order WRITE MIDDLE
// packets of one QP without AckReq merge into one record, so Python handles a run at a time.
//
// Not thread-safe (static buffers): an engine process is single-threaded.

#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define FE_TX_BATCH 64
#define FE_RX_BATCH 64
#define FE_RX_HEAD 64     // BTH 12 + RETH 16 or AETH 4: enough of any packet we parse
#define FE_HEADER_MAX 28  // BTH + RETH
#define FE_ZEROS 65536
#define PSN_MASK 0xFFFFFFu
#define ACKREQ 0x80000000u

enum { OP_FIRST = 0x06, OP_MIDDLE = 0x07, OP_LAST = 0x08, OP_LAST_IMM = 0x09, OP_ONLY = 0x0A };
enum { BTH_LEN = 12, RETH_LEN = 16, ICRC_LEN = 4 };

// One (opcode, data length) packet template of a QP; filled by Python (ctypes Structure).
struct fe_tmpl {
    uint8_t header[FE_HEADER_MAX];  // BTH (+ RETH) with PSN 0 and DMA length 0
    uint32_t header_len;
    uint32_t body_len;      // zero data + pad bytes after the header
    uint32_t crc;           // ICRC of the packet with PSN 0, AckReq clear, DMA length 0
    uint32_t ackreq_delta;  // XOR into the ICRC when AckReq is set
    uint32_t has_dma;       // the header holds a RETH whose DMA length is written per packet
    uint32_t psn_tab[3][256];  // ICRC change per PSN byte, most significant first
    uint32_t dma_tab[4][256];  // ICRC change per DMA-length byte, most significant first
};

// One received packet, or a run of in-order MIDDLE packets of one QP.
struct fe_rx {
    uint32_t qpn;     // BTH DestQP
    uint32_t psn;     // the first packet's PSN
    uint32_t count;   // packets in the record
    uint32_t bytes;   // data bytes of them all (payload minus headers, pad and ICRC)
    uint32_t aeth;    // the word after the BTH (an ACK's AETH) if has_aeth, else 0
    uint32_t ce;      // packets of the record that arrived CE-marked
    uint8_t opcode;
    uint8_t ackreq;   // AckReq of the (single) packet; runs never carry it
    uint8_t malformed;  // shorter than a BTH and an ICRC: nothing else is valid
    uint8_t has_aeth;   // long enough to hold an AETH after the BTH
};

static const uint8_t zeros[FE_ZEROS];

static inline void put_be32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static inline uint32_t get_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void put_le32(uint8_t *p, uint32_t v) {
    p[0] = v; p[1] = v >> 8; p[2] = v >> 16; p[3] = v >> 24;
}

static uint8_t tx_headers[FE_TX_BATCH][FE_HEADER_MAX];
static uint8_t tx_icrcs[FE_TX_BATCH][ICRC_LEN];
static struct iovec tx_iov[FE_TX_BATCH][3];
static struct mmsghdr tx_msgs[FE_TX_BATCH];

static int template_ok(const struct fe_tmpl *t) {
    return t->header_len <= FE_HEADER_MAX && t->body_len <= FE_ZEROS;
}

// Packet PSN p of template t into slot i of the send buffers: its header and its ICRC.
static void prepare(int i, const struct sockaddr_in *to, const struct fe_tmpl *t, uint32_t p,
                    int ack, uint32_t dma_len) {
    uint8_t *h = tx_headers[i];
    uint32_t crc = t->crc ^ t->psn_tab[0][p >> 16] ^ t->psn_tab[1][p >> 8 & 0xFF]
                 ^ t->psn_tab[2][p & 0xFF] ^ (ack ? t->ackreq_delta : 0);
    memcpy(h, t->header, t->header_len);
    put_be32(h + 8, p | (ack ? ACKREQ : 0));
    if (t->has_dma) {
        put_be32(h + BTH_LEN + 12, dma_len);
        crc ^= t->dma_tab[0][dma_len >> 24] ^ t->dma_tab[1][dma_len >> 16 & 0xFF]
             ^ t->dma_tab[2][dma_len >> 8 & 0xFF] ^ t->dma_tab[3][dma_len & 0xFF];
    }
    put_le32(tx_icrcs[i], crc);
    tx_iov[i][0] = (struct iovec){h, t->header_len};
    tx_iov[i][1] = (struct iovec){(void *)zeros, t->body_len};
    tx_iov[i][2] = (struct iovec){tx_icrcs[i], ICRC_LEN};
    tx_msgs[i].msg_hdr = (struct msghdr){.msg_name = (void *)to, .msg_namelen = sizeof(*to),
                                         .msg_iov = tx_iov[i], .msg_iovlen = 3};
}

// Send `count` packets of template t with PSNs psn, psn+1, ...; AckReq on the last one if
// ackreq_last; dma_len into the RETH (templates with one). Returns the packets the socket
// took (it stops at a full socket), or -errno when it took none.
int fe_send_run(int fd, const struct sockaddr_in *to, const struct fe_tmpl *t,
                uint32_t psn, uint32_t count, int ackreq_last, uint32_t dma_len) {
    if (!template_ok(t)) return -EINVAL;
    uint32_t done = 0;
    while (done < count) {
        uint32_t n = count - done < FE_TX_BATCH ? count - done : FE_TX_BATCH;
        for (uint32_t i = 0; i < n; i++)
            prepare(i, to, t, (psn + done + i) & PSN_MASK,
                    ackreq_last && done + i == count - 1, dma_len);
        int sent = sendmmsg(fd, tx_msgs, n, MSG_DONTWAIT);
        if (sent < 0) return done ? (int)done : -errno;
        done += sent;
        if ((uint32_t)sent < n) break;  // the socket is full
    }
    return (int)done;
}

// Packet spraying: packet PSN p leaves through socket p mod n (n a power of two) with that
// socket's template (its own UDP source port, hence its own ICRC), so consecutive packets
// rotate through the QP's entropy values. One sendmsg per packet, since each goes through
// another socket. Returns as fe_send_run: it stops at the first socket that is full.
int fe_send_spray(const int *fds, const struct sockaddr_in *to, const struct fe_tmpl *const *tmpls,
                  uint32_t n, uint32_t psn, uint32_t count, int ackreq_last, uint32_t dma_len) {
    if (n == 0 || (n & (n - 1))) return -EINVAL;
    for (uint32_t j = 0; j < n; j++)
        if (!template_ok(tmpls[j])) return -EINVAL;
    for (uint32_t done = 0; done < count; done++) {
        uint32_t p = (psn + done) & PSN_MASK;
        prepare(0, to, tmpls[p & (n - 1)], p, ackreq_last && done == count - 1, dma_len);
        if (sendmsg(fds[p & (n - 1)], &tx_msgs[0].msg_hdr, MSG_DONTWAIT) < 0)
            return done ? (int)done : -errno;
    }
    return (int)count;
}

static inline uint32_t overhead(uint8_t opcode) {
    return BTH_LEN + ((opcode == OP_FIRST || opcode == OP_ONLY) ? RETH_LEN : 0) + ICRC_LEN;
}

static inline int is_write(uint8_t opcode) { return opcode >= OP_FIRST && opcode <= OP_ONLY; }

// Receive what the socket holds, up to max_records records. Returns the records written (a
// return of max_records means more may wait), or -errno on an error other than "nothing left".
// *packets gets the datagrams read.
int fe_recv(int fd, struct fe_rx *out, int max_records, uint32_t *packets) {
    static uint8_t heads[FE_RX_BATCH][FE_RX_HEAD];
    static uint8_t controls[FE_RX_BATCH][CMSG_SPACE(sizeof(int))];
    static struct iovec iov[FE_RX_BATCH];
    static struct mmsghdr msgs[FE_RX_BATCH];
    int records = 0;
    *packets = 0;
    while (records < max_records) {
        // Never read more datagrams than records are left: each may need a record of its own.
        int want = max_records - records < FE_RX_BATCH ? max_records - records : FE_RX_BATCH;
        for (int i = 0; i < want; i++) {
            iov[i] = (struct iovec){heads[i], FE_RX_HEAD};
            msgs[i].msg_hdr = (struct msghdr){.msg_iov = &iov[i], .msg_iovlen = 1,
                                              .msg_control = controls[i],
                                              .msg_controllen = sizeof(controls[i])};
        }
        int got = recvmmsg(fd, msgs, want, MSG_DONTWAIT | MSG_TRUNC, NULL);
        if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            return records ? records : -errno;
        }
        *packets += got;
        for (int i = 0; i < got; i++) {
            const uint8_t *b = heads[i];
            uint32_t len = msgs[i].msg_len;  // the datagram's full length (MSG_TRUNC)
            uint32_t ce = 0;
            struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[i].msg_hdr);
            for (; c; c = CMSG_NXTHDR(&msgs[i].msg_hdr, c))
                if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS)
                    ce = (*(uint8_t *)CMSG_DATA(c) & 3) == 3;
            if (len < BTH_LEN + ICRC_LEN) {
                out[records++] = (struct fe_rx){.count = 1, .malformed = 1, .ce = ce};
                continue;
            }
            uint8_t opcode = b[0];
            uint32_t pad = b[1] >> 4 & 3;
            uint32_t qpn = get_be32(b + 4) & PSN_MASK;
            uint32_t psn_word = get_be32(b + 8);
            uint32_t psn = psn_word & PSN_MASK;
            uint8_t ackreq = psn_word >> 31;
            uint32_t bytes = 0;
            if (is_write(opcode) && len >= overhead(opcode) + pad) bytes = len - overhead(opcode) - pad;
            if (records > 0 && opcode == OP_MIDDLE && !ackreq) {
                struct fe_rx *prev = &out[records - 1];
                if (prev->opcode == OP_MIDDLE && !prev->ackreq && !prev->malformed && prev->qpn == qpn
                    && ((prev->psn + prev->count) & PSN_MASK) == psn) {
                    prev->count++;
                    prev->bytes += bytes;
                    prev->ce += ce;
                    continue;
                }
            }
            uint8_t has_aeth = len >= BTH_LEN + 4 + ICRC_LEN;
            out[records++] = (struct fe_rx){.qpn = qpn, .psn = psn, .count = 1, .bytes = bytes,
                                            .aeth = has_aeth ? get_be32(b + BTH_LEN) : 0, .ce = ce,
                                            .opcode = opcode, .ackreq = ackreq,
                                            .has_aeth = has_aeth};
        }
        if (got < want) break;  // the socket is empty
    }
    return records;
}
