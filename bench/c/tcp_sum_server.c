/*
 * tcp_sum_server: a minimal TCP parameter server in plain C, the reference the agg-throughput
 * benchmark holds its Rust TCP server to.
 *
 *   tcp_sum_server ADDR PORT WORKERS VALUES
 *
 * Accepts WORKERS connections on ADDR:PORT. Each worker streams its gradient, VALUES int32
 * little-endian values per round, round after round; the server adds every value into the
 * round's sum as the bytes arrive (int32, wrapping) and streams the sum back to every worker as
 * soon as all workers' values up to that point have arrived. One thread, edge-triggered epoll,
 * non-blocking sockets, TCP_NODELAY and 4 MiB socket buffers: the same design as the Rust
 * server (bench/src/tcp_ps.rs), so the two figures can be compared. Two sum buffers by round
 * parity: a fast worker may send round r + 1 while a slow one still receives round r's sum.
 * Exits 0 when every worker has closed its connection, 1 with a sentence on stderr otherwise.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_WORKERS 64
#define STAGE (256 * 1024)
#define SOCKBUF (4 * 1024 * 1024)

struct conn {
	int fd;
	int open;
	uint64_t rx_round; /* the round this worker is sending */
	uint64_t rx_vals;  /* values of rx_round received */
	unsigned char stage[STAGE + 4];
	size_t carry; /* bytes of an incomplete value at stage[0..carry] */
	uint64_t tx_round; /* the round whose sum this worker is receiving */
	uint64_t tx_bytes; /* bytes of that sum sent */
};

static struct conn conns[MAX_WORKERS];
static int workers;
static uint64_t values;
static int32_t *acc[2];
static uint64_t done_sending[2]; /* workers that have the whole sum of the buffer's round */

static void die(const char *what)
{
	fprintf(stderr, "tcp_sum_server: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* Values of round r summed by every worker so far. */
static uint64_t ready(uint64_t r)
{
	uint64_t m = values;
	for (int w = 0; w < workers; w++) {
		uint64_t have = conns[w].rx_round > r ? values :
				conns[w].rx_round == r ? conns[w].rx_vals : 0;
		if (have < m)
			m = have;
	}
	return m;
}

static void add_values(struct conn *c, const unsigned char *p, uint64_t n)
{
	while (n > 0) {
		uint64_t room = values - c->rx_vals;
		uint64_t k = n < room ? n : room;
		int32_t *a = acc[c->rx_round & 1] + c->rx_vals;
		for (uint64_t i = 0; i < k; i++) {
			int32_t v;
			memcpy(&v, p + 4 * i, 4);
			a[i] = (int32_t)((uint32_t)a[i] + (uint32_t)v);
		}
		p += 4 * k;
		n -= k;
		c->rx_vals += k;
		if (c->rx_vals == values) {
			c->rx_round++;
			c->rx_vals = 0;
		}
	}
}

/* Reads until the socket has nothing more (edge-triggered); returns 0 when the peer closed. */
static int on_readable(struct conn *c)
{
	for (;;) {
		ssize_t n = read(c->fd, c->stage + c->carry, STAGE - c->carry);
		if (n == 0)
			return 0;
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 1;
			if (errno == EINTR)
				continue;
			die("read");
		}
		size_t have = c->carry + (size_t)n;
		size_t whole = have / 4;
		add_values(c, c->stage, whole);
		c->carry = have - whole * 4;
		memmove(c->stage, c->stage + whole * 4, c->carry);
	}
}

/* Sends what is summed and not yet sent; stops at a full socket buffer. */
static void flush(struct conn *c)
{
	for (;;) {
		uint64_t r = c->tx_round;
		uint64_t avail = ready(r) * 4;
		if (c->tx_bytes >= avail)
			return;
		const char *base = (const char *)acc[r & 1];
		ssize_t n = write(c->fd, base + c->tx_bytes, avail - c->tx_bytes);
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			if (errno == EINTR)
				continue;
			die("write");
		}
		c->tx_bytes += (uint64_t)n;
		if (c->tx_bytes == values * 4) {
			c->tx_round++;
			c->tx_bytes = 0;
			/* Everyone has round r's sum: nobody can send round r + 2 before this, so the
			 * buffer is cleared for it now. */
			if (++done_sending[r & 1] == (uint64_t)workers) {
				done_sending[r & 1] = 0;
				memset(acc[r & 1], 0, values * 4);
			}
		}
	}
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: tcp_sum_server ADDR PORT WORKERS VALUES\n");
		return 2;
	}
	workers = atoi(argv[3]);
	values = strtoull(argv[4], NULL, 10);
	if (workers < 1 || workers > MAX_WORKERS || values == 0) {
		fprintf(stderr, "tcp_sum_server: workers must be 1 to %d and values positive\n",
			MAX_WORKERS);
		return 2;
	}
	for (int i = 0; i < 2; i++) {
		acc[i] = calloc(values, 4);
		if (!acc[i])
			die("calloc");
	}
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	if (ls < 0)
		die("socket");
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
	if (inet_pton(AF_INET, argv[1], &sa.sin_addr) != 1) {
		fprintf(stderr, "tcp_sum_server: %s is not an IPv4 address\n", argv[1]);
		return 2;
	}
	if (bind(ls, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("bind");
	if (listen(ls, MAX_WORKERS) < 0)
		die("listen");
	int ep = epoll_create1(0);
	if (ep < 0)
		die("epoll_create1");
	for (int w = 0; w < workers; w++) {
		int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
		if (fd < 0)
			die("accept");
		int buf = SOCKBUF;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof(buf)) < 0)
			setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
		if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof(buf)) < 0)
			setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
		conns[w].fd = fd;
		conns[w].open = 1;
		struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLET, .data.u32 = w };
		if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
			die("epoll_ctl");
	}
	close(ls);
	int open = workers;
	struct epoll_event evs[MAX_WORKERS];
	while (open > 0) {
		int n = epoll_wait(ep, evs, MAX_WORKERS, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("epoll_wait");
		}
		int progressed = 0;
		for (int i = 0; i < n; i++) {
			struct conn *c = &conns[evs[i].data.u32];
			if (!c->open)
				continue;
			if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
				uint64_t before = c->rx_round * values + c->rx_vals;
				if (!on_readable(c)) {
					c->open = 0;
					open--;
					close(c->fd);
					continue;
				}
				progressed |= c->rx_round * values + c->rx_vals != before;
			}
			if (evs[i].events & EPOLLOUT)
				flush(c);
		}
		/* New values may have made more of a sum ready for every worker. */
		if (progressed)
			for (int w = 0; w < workers; w++)
				if (conns[w].open)
					flush(&conns[w]);
	}
	return 0;
}
