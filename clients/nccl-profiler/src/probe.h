/*
 * The plugin's connection to the yard node: frame encoding (the format is specified in
 * diagnosis/src/wire.rs of the Switchyard repository) and a non-blocking sender. Not
 * thread-safe: the plugin calls it under its own lock.
 */
#ifndef YARD_PROBE_H
#define YARD_PROBE_H

#include <stddef.h>
#include <stdint.h>

enum { YARD_OP_OTHER = 255, YARD_DTYPE_OTHER = 255 };
enum { YARD_PHASE_ENQUEUE = 0, YARD_PHASE_START = 1, YARD_PHASE_END = 2 };
enum { YARD_DIR_SEND = 0, YARD_DIR_RECV = 1 };

struct yard_hello {
  uint32_t rank, world_size, local_rank, pid;
  char job[256], nic[256], sw[256];
  uint16_t ports[64];
  uint16_t nports;
};

/* CLOCK_REALTIME now, in nanoseconds. */
uint64_t yard_now_ns(void);

/* Sets where to connect and how to introduce ourselves; nothing is sent yet. */
void yard_conn_setup(const char *path, const struct yard_hello *hello);
/* Registers a group, replayed after every (re)connect. Returns its handle. */
uint32_t yard_conn_group(const char *name, const char *desc, const uint32_t *ranks, uint32_t n);
void yard_conn_coll(uint32_t handle, uint64_t seq, uint8_t op, uint8_t dtype, uint8_t phase,
                    int has_peer, uint32_t peer, uint64_t count, uint64_t bytes);
void yard_conn_peer(uint32_t handle, uint64_t seq, uint32_t peer, uint8_t dir, uint64_t bytes,
                    uint64_t busy_ns);
void yard_conn_heartbeat(void);
void yard_conn_exit(void);
/* Closes the socket and forgets groups. */
void yard_conn_close(void);
/* Frames dropped so far (node absent, gone or not reading). */
uint64_t yard_conn_dropped(void);

#endif
