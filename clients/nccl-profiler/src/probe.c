/*
 * Frame encoding and a sender that never blocks NCCL: every frame is one send() with
 * MSG_DONTWAIT | MSG_NOSIGNAL. If the node is absent, gone or its buffer is full, the frame is
 * dropped and counted. A frame the socket took only in part is kept in a backlog and finished
 * before anything else, so the stream never goes out of step. Reconnects are attempted at most
 * every 100 ms and start with HELLO and every GROUP.
 */
#define _GNU_SOURCE
#include "probe.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_BODY 4096
#define MAX_STR 255
#define MAX_GROUP_RANKS 800
#define RECONNECT_NS 100000000ull

static struct {
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  struct yard_hello hello;
  int fd;
  uint64_t last_attempt_ns;
  uint64_t dropped;
  /* Unsent bytes: a partial frame, or HELLO + GROUPs after a connect. */
  uint8_t *backlog;
  size_t backlog_len, backlog_cap;
  /* Every GROUP frame sent so far, for replay. */
  uint8_t *groups;
  size_t groups_len, groups_cap;
  uint32_t next_handle;
} conn = {.fd = -1};

uint64_t yard_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A growable byte buffer that fails soft: on allocation failure it stays as it was. */
static int buf_append(uint8_t **buf, size_t *len, size_t *cap, const void *data, size_t n) {
  if (*len + n > *cap) {
    size_t want = *cap ? *cap : 256;
    while (want < *len + n) want *= 2;
    uint8_t *grown = realloc(*buf, want);
    if (!grown) return -1;
    *buf = grown;
    *cap = want;
  }
  memcpy(*buf + *len, data, n);
  *len += n;
  return 0;
}

/* Little-endian writers into a frame under construction. */
struct frame {
  uint8_t b[4 + MAX_BODY];
  size_t n;
};

static void put(struct frame *f, uint64_t v, int bytes) {
  for (int i = 0; i < bytes && f->n < sizeof f->b; i++) f->b[f->n++] = (uint8_t)(v >> (8 * i));
}

static void put_str(struct frame *f, const char *s) {
  size_t len = s ? strlen(s) : 0;
  if (len > MAX_STR) {
    len = MAX_STR;
    /* Back off to a UTF-8 character boundary (a continuation byte is 10xxxxxx). */
    while (len > 0 && ((unsigned char)s[len] & 0xC0) == 0x80) len--;
  }
  put(f, len, 2);
  if (f->n + len <= sizeof f->b) {
    memcpy(f->b + f->n, s, len);
    f->n += len;
  }
}

static void begin(struct frame *f, uint8_t type) {
  f->n = 4;
  put(f, type, 1);
}

static void finish(struct frame *f) {
  uint32_t body = (uint32_t)(f->n - 4);
  for (int i = 0; i < 4; i++) f->b[i] = (uint8_t)(body >> (8 * i));
}

static void disconnect(void) {
  if (conn.fd >= 0) close(conn.fd);
  conn.fd = -1;
  conn.backlog_len = 0;
}

static void encode_hello(struct frame *f) {
  const struct yard_hello *h = &conn.hello;
  begin(f, 1);
  put(f, 1, 2);
  put(f, h->rank, 4);
  put(f, h->world_size, 4);
  put(f, h->local_rank, 4);
  put(f, h->pid, 4);
  put_str(f, h->job);
  put_str(f, "");
  put_str(f, h->nic);
  put_str(f, h->sw);
  put(f, h->nports, 2);
  for (int i = 0; i < h->nports; i++) put(f, h->ports[i], 2);
  finish(f);
}

static int try_connect(void) {
  if (conn.fd >= 0) return 1;
  if (!conn.path[0]) return 0;
  uint64_t now = yard_now_ns();
  if (conn.last_attempt_ns && now - conn.last_attempt_ns < RECONNECT_NS) return 0;
  conn.last_attempt_ns = now;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  memcpy(addr.sun_path, conn.path, sizeof addr.sun_path);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
    close(fd);
    return 0;
  }
  conn.fd = fd;
  conn.backlog_len = 0;
  struct frame f;
  encode_hello(&f);
  if (buf_append(&conn.backlog, &conn.backlog_len, &conn.backlog_cap, f.b, f.n) != 0 ||
      buf_append(&conn.backlog, &conn.backlog_len, &conn.backlog_cap, conn.groups,
                 conn.groups_len) != 0) {
    disconnect();
    return 0;
  }
  return 1;
}

/* Writes what it can; 1 when nothing is left, 0 if the socket is full or gone. */
static int flush_backlog(void) {
  size_t off = 0;
  while (off < conn.backlog_len) {
    ssize_t n = send(conn.fd, conn.backlog + off, conn.backlog_len - off,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      off += (size_t)n;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      disconnect();
      return 0;
    }
  }
  memmove(conn.backlog, conn.backlog + off, conn.backlog_len - off);
  conn.backlog_len -= off;
  return conn.backlog_len == 0;
}

/* Sends one frame or drops and counts it. */
static void send_frame(const struct frame *f) {
  if (!try_connect() || !flush_backlog()) {
    conn.dropped++;
    return;
  }
  for (;;) {
    ssize_t n = send(conn.fd, f->b, f->n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      if ((size_t)n < f->n &&
          buf_append(&conn.backlog, &conn.backlog_len, &conn.backlog_cap, f->b + n,
                     f->n - (size_t)n) != 0)
        disconnect(); /* cannot keep the tail: the stream would go out of step */
      return;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) disconnect();
    conn.dropped++;
    return;
  }
}

void yard_conn_setup(const char *path, const struct yard_hello *hello) {
  strncpy(conn.path, path, sizeof conn.path - 1);
  conn.hello = *hello;
}

uint32_t yard_conn_group(const char *name, const char *desc, const uint32_t *ranks, uint32_t n) {
  uint32_t handle = conn.next_handle++;
  uint32_t done = 0;
  do {
    uint32_t chunk = n - done > MAX_GROUP_RANKS ? MAX_GROUP_RANKS : n - done;
    struct frame f;
    begin(&f, 2);
    put(&f, handle, 4);
    put_str(&f, name);
    put_str(&f, desc);
    put(&f, chunk, 4);
    for (uint32_t i = 0; i < chunk; i++) put(&f, ranks[done + i], 4);
    finish(&f);
    buf_append(&conn.groups, &conn.groups_len, &conn.groups_cap, f.b, f.n);
    if (conn.fd >= 0) buf_append(&conn.backlog, &conn.backlog_len, &conn.backlog_cap, f.b, f.n);
    done += chunk;
  } while (done < n);
  if (conn.fd >= 0) flush_backlog();
  return handle;
}

void yard_conn_coll(uint32_t handle, uint64_t seq, uint8_t op, uint8_t dtype, uint8_t phase,
                    int has_peer, uint32_t peer, uint64_t count, uint64_t bytes) {
  struct frame f;
  begin(&f, 3);
  put(&f, handle, 4);
  put(&f, seq, 8);
  put(&f, op, 1);
  put(&f, dtype, 1);
  put(&f, phase, 1);
  put(&f, has_peer ? 1 : 0, 1);
  put(&f, has_peer ? peer : 0, 4);
  put(&f, count, 8);
  put(&f, bytes, 8);
  put(&f, yard_now_ns(), 8);
  finish(&f);
  send_frame(&f);
}

void yard_conn_peer(uint32_t handle, uint64_t seq, uint32_t peer, uint8_t dir, uint64_t bytes,
                    uint64_t busy_ns) {
  struct frame f;
  begin(&f, 4);
  put(&f, handle, 4);
  put(&f, seq, 8);
  put(&f, peer, 4);
  put(&f, dir, 1);
  put(&f, bytes, 8);
  put(&f, busy_ns, 8);
  put(&f, yard_now_ns(), 8);
  finish(&f);
  send_frame(&f);
}

static void send_time(uint8_t type) {
  struct frame f;
  begin(&f, type);
  put(&f, yard_now_ns(), 8);
  finish(&f);
  send_frame(&f);
}

void yard_conn_heartbeat(void) { send_time(5); }

void yard_conn_exit(void) { send_time(6); }

void yard_conn_close(void) {
  disconnect();
  free(conn.backlog);
  free(conn.groups);
  conn.backlog = conn.groups = NULL;
  conn.backlog_cap = conn.groups_len = conn.groups_cap = 0;
  conn.next_handle = 0;
  conn.last_attempt_ns = 0;
}

uint64_t yard_conn_dropped(void) { return conn.dropped; }
