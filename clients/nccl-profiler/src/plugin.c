/*
 * libnccl-profiler-yard: an NCCL profiler plugin (interfaces v5 and v4) that reports each collective
 * and point-to-point op of this process to the local yard node, in the wire format specified
 * in diagnosis/src/wire.rs of the Switchyard repository.
 *
 * Mapping from NCCL events to wire records:
 *   init                 HELLO once per process (rank/world from $RANK/$WORLD_SIZE, else the
 *                        first communicator's rank and size; job from $YARD_JOB), then one
 *                        GROUP per communicator, named by commName or "nccl:<commId hex>".
 *   Coll / P2p start     COLL enqueue. seq is the plugin's own per-communicator counter
 *                        (collectives and p2p counted separately, from 1), not NCCL's
 *                        seqNumber: NCCL numbers each collective *type* separately, so two
 *                        different ops can share a seqNumber, while every rank issues a
 *                        communicator's ops in the same order and so agrees on our count.
 *   first KernelCh or    COLL start (data movement began on this rank).
 *   ProxyOp start
 *   ProxyStep states     bytes (transSize) and time spent in SendPeerWait/SendWait/RecvWait,
 *                        summed per (op, peer, direction) and sent as PEER records when a
 *                        ProxyOp stops and at most every 10 ms while it runs.
 *   completion           COLL end. NCCL's caveat: Coll/P2p stopEvent means the op was
 *                        *enqueued*, not completed. Completion is inferred: the op is done
 *                        when its stopEvent has come, every one of its nChannels KernelCh
 *                        events has stopped, and no ProxyOp of it is still running.
 *   last finalize        EXIT.
 * A heartbeat thread sends HEARTBEAT every 100 ms while any communicator is open.
 *
 * Peers: NCCL reports peers as ranks in the communicator. For a communicator spanning the
 * whole world those are global ranks; for a smaller one the plugin cannot learn the global
 * ranks, so it reports the communicator's rank and lists only its own global rank in GROUP.
 *
 * The plugin never fails or blocks NCCL: all sends are non-blocking and dropped when the node
 * is away, allocation failures skip the event, and ProxyOps of another process (PXN, where the
 * parent pointer belongs to another address space) are ignored.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "probe.h"
#include "yard_nccl_profiler.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_PEERS 8
#define PEER_REPORT_NS 10000000ull

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int open_comms;
static pthread_t beat_thread;
static int beat_running;
static pthread_cond_t beat_cond = PTHREAD_COND_INITIALIZER;

struct comm {
  uint32_t handle;
  int nranks, rank;
  int world; /* the communicator spans the job: comm ranks are global ranks */
  uint64_t coll_seq, p2p_seq;
};

enum kind { K_OP, K_KERNEL, K_PROXY, K_STEP };

struct peer_stat {
  uint32_t peer;
  uint8_t dir;
  uint64_t bytes, busy_ns;
};

/* A collective or p2p op. It holds one reference to itself until it has ended and one per
 * child event, and is freed when the last goes (an op that never ends is a hang, and stays). */
struct op {
  enum kind kind;
  struct comm *comm;
  uint64_t seq, count, bytes;
  uint8_t op, dtype;
  int has_peer;
  uint32_t peer;
  int nchannels, kernels_stopped, proxies_running;
  int enqueued, started, ended;
  int refs;
  struct peer_stat peers[MAX_PEERS];
  int npeers;
  uint64_t last_peer_report_ns;
};

/* A KernelCh, ProxyOp or ProxyStep: points at its op (or, for a step, its ProxyOp). */
struct child {
  enum kind kind;
  struct op *op;
  struct child *proxy; /* steps: the ProxyOp */
  int refs;            /* ProxyOps: 1 + live steps */
  uint32_t peer;
  uint8_t dir;
  size_t step_bytes;
  uint64_t wait_since_ns;
  uint64_t waited_ns;
};

static void *heartbeat_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lock);
  while (beat_running) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 100000000;
    if (until.tv_nsec >= 1000000000) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&beat_cond, &lock, &until);
    if (beat_running) yard_conn_heartbeat();
  }
  pthread_mutex_unlock(&lock);
  return NULL;
}

static uint32_t env_u32(const char *name, uint32_t fallback) {
  const char *v = getenv(name);
  if (!v || !*v) return fallback;
  char *end;
  unsigned long n = strtoul(v, &end, 10);
  return *end ? fallback : (uint32_t)n;
}

static void env_str(char *dst, size_t cap, const char *name) {
  const char *v = getenv(name);
  snprintf(dst, cap, "%s", v ? v : "");
}

/* $YARD_PORTS: comma-separated port numbers. */
static void env_ports(struct yard_hello *h) {
  const char *v = getenv("YARD_PORTS");
  while (v && *v && h->nports < sizeof h->ports / sizeof h->ports[0]) {
    char *end;
    unsigned long p = strtoul(v, &end, 10);
    if (end == v) break;
    if (p > 0 && p < 65536) h->ports[h->nports++] = (uint16_t)p;
    v = *end == ',' ? end + 1 : end;
  }
}

static uint8_t op_code(const char *func) {
  static const char *names[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                "Reduce",    "AllToAll",  NULL,            "Send",
                                "Recv",      "Gather",    "Scatter"};
  if (func)
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
      if (names[i] && strcmp(func, names[i]) == 0) return (uint8_t)i;
  return YARD_OP_OTHER;
}

/* NCCL datatype name -> (wire dtype code, element size). */
static uint8_t dtype_code(const char *dt, unsigned *size) {
  static const struct {
    const char *name;
    uint8_t code;
    unsigned size;
  } table[] = {
      {"ncclFloat32", 0, 4},       {"ncclFloat16", 1, 2},    {"ncclBfloat16", 2, 2},
      {"ncclFloat64", 3, 8},       {"ncclInt32", 4, 4},      {"ncclInt64", 5, 8},
      {"ncclInt8", 6, 1},          {"ncclUint8", 7, 1},      {"ncclFloat8e4m3", 9, 1},
      {"ncclFloat8e5m2", 9, 1},    {"ncclUint32", 255, 4},   {"ncclUint64", 255, 8},
  };
  *size = 1;
  if (dt)
    for (unsigned i = 0; i < sizeof table / sizeof table[0]; i++)
      if (strcmp(dt, table[i].name) == 0) {
        *size = table[i].size;
        return table[i].code;
      }
  return YARD_DTYPE_OTHER;
}

static yard_nccl_result_t yard_init(void **context, uint64_t comm_id, int *activation_mask,
                                    const char *comm_name, int nnodes, int nranks, int rank,
                                    yard_nccl_logger_t logfn) {
  (void)nnodes;
  (void)logfn;
  *context = NULL;
  *activation_mask = YARD_PROFILE_COLL | YARD_PROFILE_P2P | YARD_PROFILE_PROXY_OP |
                     YARD_PROFILE_PROXY_STEP | YARD_PROFILE_KERNEL_CH;
  struct comm *c = calloc(1, sizeof *c);
  if (!c) return yardNcclSuccess; /* NULL context: events of this comm are ignored */
  pthread_mutex_lock(&lock);
  static struct yard_hello hello;
  if (open_comms == 0) {
    memset(&hello, 0, sizeof hello);
    hello.world_size = env_u32("WORLD_SIZE", (uint32_t)nranks);
    hello.rank = env_u32("RANK", (uint32_t)rank);
    hello.local_rank = env_u32("LOCAL_RANK", 0);
    hello.pid = (uint32_t)getpid();
    env_str(hello.job, sizeof hello.job, "YARD_JOB");
    env_str(hello.nic, sizeof hello.nic, "YARD_NIC");
    env_str(hello.sw, sizeof hello.sw, "YARD_SWITCH");
    env_ports(&hello);
    const char *path = getenv("YARD_PROBE_SOCKET");
    yard_conn_setup(path && *path ? path : "/var/lib/yard/probe.sock", &hello);
  }
  c->nranks = nranks;
  c->rank = rank;
  c->world = (uint32_t)nranks == hello.world_size;
  char name[64];
  if (comm_name && *comm_name)
    snprintf(name, sizeof name, "%s", comm_name);
  else
    snprintf(name, sizeof name, "nccl:%016llx", (unsigned long long)comm_id);
  uint32_t n = c->world ? (uint32_t)nranks : 1;
  uint32_t *ranks = malloc(n * sizeof *ranks);
  if (ranks) {
    for (uint32_t i = 0; i < n; i++) ranks[i] = c->world ? i : hello.rank;
    c->handle = yard_conn_group(name, "nccl", ranks, n);
    free(ranks);
  } else {
    c->handle = yard_conn_group(name, "nccl", &hello.rank, 1);
  }
  if (open_comms++ == 0) {
    beat_running = 1;
    if (pthread_create(&beat_thread, NULL, heartbeat_main, NULL) != 0) beat_running = 0;
  }
  pthread_mutex_unlock(&lock);
  *context = c;
  return yardNcclSuccess;
}

static void op_release(struct op *o) {
  if (--o->refs == 0) free(o);
}

static void report_peers(struct op *o) {
  for (int i = 0; i < o->npeers; i++)
    yard_conn_peer(o->comm->handle, o->seq, o->peers[i].peer, o->peers[i].dir,
                   o->peers[i].bytes, o->peers[i].busy_ns);
  o->last_peer_report_ns = yard_now_ns();
}

static void op_maybe_end(struct op *o) {
  if (o->ended || !o->enqueued || o->proxies_running > 0) return;
  if (o->nchannels > 0 ? o->kernels_stopped < o->nchannels : !o->started) return;
  o->ended = 1;
  yard_conn_coll(o->comm->handle, o->seq, o->op, o->dtype, YARD_PHASE_END, o->has_peer, o->peer,
                 o->count, o->bytes);
  op_release(o); /* may free o: callers do not touch it afterwards */
}

static void op_started(struct op *o) {
  if (o->started) return;
  o->started = 1;
  yard_conn_coll(o->comm->handle, o->seq, o->op, o->dtype, YARD_PHASE_START, o->has_peer,
                 o->peer, o->count, o->bytes);
}

static uint32_t global_rank(const struct comm *c, int comm_rank) {
  (void)c;
  return (uint32_t)comm_rank; /* exact when c->world; see the file comment otherwise */
}

static yard_nccl_result_t yard_start_event(void *context, void **handle,
                                           yard_nccl_event_descr_v5_t *d) {
  *handle = NULL;
  struct comm *c = context;
  if (!c || !d) return yardNcclSuccess;
  pthread_mutex_lock(&lock);
  if (d->type == YARD_PROFILE_COLL || d->type == YARD_PROFILE_P2P) {
    struct op *o = calloc(1, sizeof *o);
    if (o) {
      int p2p = d->type == YARD_PROFILE_P2P;
      unsigned size;
      o->kind = K_OP;
      o->comm = c;
      o->refs = 1;
      o->op = op_code(p2p ? d->p2p.func : d->coll.func);
      o->dtype = dtype_code(p2p ? d->p2p.datatype : d->coll.datatype, &size);
      o->count = p2p ? d->p2p.count : d->coll.count;
      o->bytes = o->count * size;
      o->nchannels = p2p ? d->p2p.nChannels : d->coll.nChannels;
      o->seq = p2p ? ++c->p2p_seq : ++c->coll_seq;
      if (p2p) {
        o->has_peer = 1;
        o->peer = global_rank(c, d->p2p.peer);
      }
      yard_conn_coll(c->handle, o->seq, o->op, o->dtype, YARD_PHASE_ENQUEUE, o->has_peer,
                     o->peer, o->count, o->bytes);
      *handle = o;
    }
  } else if (d->type == YARD_PROFILE_KERNEL_CH || d->type == YARD_PROFILE_PROXY_OP) {
    struct op *o = d->parentObj;
    int foreign = d->type == YARD_PROFILE_PROXY_OP && d->proxyOp.pid != getpid();
    struct child *ch = (o && !foreign && o->kind == K_OP) ? calloc(1, sizeof *ch) : NULL;
    if (ch) {
      ch->op = o;
      o->refs++;
      if (d->type == YARD_PROFILE_KERNEL_CH) {
        ch->kind = K_KERNEL;
      } else {
        ch->kind = K_PROXY;
        ch->refs = 1;
        ch->peer = global_rank(c, d->proxyOp.peer);
        ch->dir = d->proxyOp.isSend ? YARD_DIR_SEND : YARD_DIR_RECV;
        o->proxies_running++;
      }
      op_started(o);
      *handle = ch;
    }
  } else if (d->type == YARD_PROFILE_PROXY_STEP) {
    struct child *proxy = d->parentObj;
    struct child *ch =
        (proxy && proxy->kind == K_PROXY) ? calloc(1, sizeof *ch) : NULL;
    if (ch) {
      ch->kind = K_STEP;
      ch->proxy = proxy;
      proxy->refs++;
      *handle = ch;
    }
  }
  pthread_mutex_unlock(&lock);
  return yardNcclSuccess;
}

static int is_wait_state(int state) {
  return state == YARD_STATE_PROXY_STEP_SEND_PEER_WAIT ||
         state == YARD_STATE_PROXY_STEP_SEND_WAIT || state == YARD_STATE_PROXY_STEP_RECV_WAIT;
}

static void step_close_wait(struct child *s, uint64_t now) {
  if (s->wait_since_ns) {
    s->waited_ns += now - s->wait_since_ns;
    s->wait_since_ns = 0;
  }
}

static struct peer_stat *peer_slot(struct op *o, uint32_t peer, uint8_t dir) {
  for (int i = 0; i < o->npeers; i++)
    if (o->peers[i].peer == peer && o->peers[i].dir == dir) return &o->peers[i];
  if (o->npeers == MAX_PEERS) return NULL;
  struct peer_stat *p = &o->peers[o->npeers++];
  p->peer = peer;
  p->dir = dir;
  return p;
}

static void proxy_release(struct child *p) {
  if (--p->refs > 0) return;
  struct op *o = p->op;
  free(p);
  op_release(o);
}

static yard_nccl_result_t yard_record_event_state(void *handle, yard_nccl_event_state_t state,
                                                  yard_nccl_event_state_args_v5_t *args) {
  struct child *s = handle;
  if (!s) return yardNcclSuccess;
  pthread_mutex_lock(&lock);
  if (s->kind == K_STEP) {
    uint64_t now = yard_now_ns();
    step_close_wait(s, now);
    if (is_wait_state(state)) s->wait_since_ns = now;
    if (args && args->proxyStep.transSize > s->step_bytes) s->step_bytes = args->proxyStep.transSize;
  }
  pthread_mutex_unlock(&lock);
  return yardNcclSuccess;
}

static yard_nccl_result_t yard_stop_event(void *handle) {
  if (!handle) return yardNcclSuccess;
  pthread_mutex_lock(&lock);
  enum kind kind = *(enum kind *)handle;
  if (kind == K_OP) {
    struct op *o = handle;
    o->enqueued = 1;
    op_maybe_end(o);
  } else if (kind == K_KERNEL) {
    struct child *k = handle;
    struct op *o = k->op;
    o->kernels_stopped++;
    free(k);
    op_maybe_end(o); /* o stays alive: k's reference is released below */
    op_release(o);
  } else if (kind == K_STEP) {
    struct child *s = handle;
    struct child *p = s->proxy;
    struct op *o = p->op;
    step_close_wait(s, yard_now_ns());
    struct peer_stat *stat = peer_slot(o, p->peer, p->dir);
    if (stat) {
      stat->bytes += s->step_bytes;
      stat->busy_ns += s->waited_ns;
    }
    if (yard_now_ns() - o->last_peer_report_ns >= PEER_REPORT_NS) report_peers(o);
    free(s);
    proxy_release(p);
  } else if (kind == K_PROXY) {
    struct child *p = handle;
    struct op *o = p->op;
    o->proxies_running--;
    report_peers(o);
    op_maybe_end(o);
    proxy_release(p);
  }
  pthread_mutex_unlock(&lock);
  return yardNcclSuccess;
}

static yard_nccl_result_t yard_finalize(void *context) {
  pthread_mutex_lock(&lock);
  free(context);
  int last = --open_comms == 0;
  int join = 0;
  if (last) {
    yard_conn_exit();
    join = beat_running;
    beat_running = 0;
    pthread_cond_broadcast(&beat_cond);
  }
  pthread_mutex_unlock(&lock);
  if (join) pthread_join(beat_thread, NULL);
  if (last) {
    pthread_mutex_lock(&lock);
    if (open_comms == 0) yard_conn_close();
    pthread_mutex_unlock(&lock);
  }
  return yardNcclSuccess;
}

EXPORT yard_nccl_profiler_v5_t ncclProfiler_v5 = {
    .name = "yard",
    .init = yard_init,
    .startEvent = yard_start_event,
    .stopEvent = yard_stop_event,
    .recordEventState = yard_record_event_state,
    .finalize = yard_finalize,
};

/* Interface v4 (NCCL 2.27), onto the v5 functions: the descriptor's members are copied into
 * a v5 one (v4 lacks only what v5 added: API events, parentGroup, a wider type), init's
 * arguments are reordered, and the state arguments have the same members. */
static yard_nccl_result_t yard_init_v4(void **context, int *activation_mask,
                                       const char *comm_name, uint64_t comm_hash, int nnodes,
                                       int nranks, int rank, yard_nccl_logger_t logfn) {
  return yard_init(context, comm_hash, activation_mask, comm_name, nnodes, nranks, rank, logfn);
}

static yard_nccl_result_t yard_start_event_v4(void *context, void **handle,
                                              yard_nccl_event_descr_v4_t *d4) {
  if (!d4) {
    *handle = NULL;
    return yardNcclSuccess;
  }
  yard_nccl_event_descr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = d4->type;
  d.parentObj = d4->parentObj;
  d.rank = d4->rank;
  switch (d4->type) {
    case YARD_PROFILE_COLL:
      d.coll.seqNumber = d4->coll.seqNumber;
      d.coll.func = d4->coll.func;
      d.coll.sendBuff = d4->coll.sendBuff;
      d.coll.recvBuff = d4->coll.recvBuff;
      d.coll.count = d4->coll.count;
      d.coll.root = d4->coll.root;
      d.coll.datatype = d4->coll.datatype;
      d.coll.nChannels = d4->coll.nChannels;
      d.coll.nWarps = d4->coll.nWarps;
      d.coll.algo = d4->coll.algo;
      d.coll.proto = d4->coll.proto;
      break;
    case YARD_PROFILE_P2P:
      d.p2p.func = d4->p2p.func;
      d.p2p.buff = d4->p2p.buff;
      d.p2p.datatype = d4->p2p.datatype;
      d.p2p.count = d4->p2p.count;
      d.p2p.peer = d4->p2p.peer;
      d.p2p.nChannels = d4->p2p.nChannels;
      break;
    case YARD_PROFILE_PROXY_OP:
      d.proxyOp.pid = d4->proxyOp.pid;
      d.proxyOp.channelId = d4->proxyOp.channelId;
      d.proxyOp.peer = d4->proxyOp.peer;
      d.proxyOp.nSteps = d4->proxyOp.nSteps;
      d.proxyOp.chunkSize = d4->proxyOp.chunkSize;
      d.proxyOp.isSend = d4->proxyOp.isSend;
      break;
    case YARD_PROFILE_PROXY_STEP:
      d.proxyStep.step = d4->proxyStep.step;
      break;
    case YARD_PROFILE_KERNEL_CH:
      d.kernelCh.channelId = d4->kernelCh.channelId;
      d.kernelCh.pTimer = d4->kernelCh.pTimer;
      break;
    default:
      break; /* groups, proxy control, net plugin: not used */
  }
  return yard_start_event(context, handle, &d);
}

static yard_nccl_result_t yard_record_event_state_v4(void *handle, yard_nccl_event_state_t state,
                                                     yard_nccl_event_state_args_v4_t *args4) {
  yard_nccl_event_state_args_v5_t args;
  memset(&args, 0, sizeof args);
  if (args4) memcpy(&args, args4, sizeof args < sizeof *args4 ? sizeof args : sizeof *args4);
  return yard_record_event_state(handle, state, args4 ? &args : NULL);
}

EXPORT yard_nccl_profiler_v4_t ncclProfiler_v4 = {
    .name = "yard",
    .init = yard_init_v4,
    .startEvent = yard_start_event_v4,
    .stopEvent = yard_stop_event,
    .recordEventState = yard_record_event_state_v4,
    .finalize = yard_finalize,
};

/* Dropped frames so far, for tests and debugging (not part of NCCL's ABI). */
EXPORT uint64_t yard_profiler_dropped(void) {
  pthread_mutex_lock(&lock);
  uint64_t n = yard_conn_dropped();
  pthread_mutex_unlock(&lock);
  return n;
}
