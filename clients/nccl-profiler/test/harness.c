/*
 * Drives libnccl-profiler-yard.so the way NCCL would for two all_reduce ops on a 2-rank
 * communicator, with the plugin's socket at $YARD_PROBE_SOCKET:
 *   init -> per op: Coll start, Coll stop (= enqueued), 2 KernelCh starts, a send and a recv
 *   ProxyOp with two ProxySteps each (transSize and wait states), ProxyOp stops, KernelCh
 *   stops -> finalize.
 * Usage: harness PLUGIN.so [VERSION]: through the ncclProfiler_v5 table (default) or, with 4,
 * the ncclProfiler_v4 one NCCL 2.27 uses, whose descriptors are built in v4's layout. Prints
 * the plugin's dropped-frame count; exits non-zero if the plugin cannot be loaded.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "yard_nccl_profiler.h"

static int version = 5;
static yard_nccl_profiler_v5_t *prof;
static yard_nccl_profiler_v4_t *prof4;

/* The v4 layout of a descriptor: the members v4 has, copied. */
static void to_v4(const yard_nccl_event_descr_v5_t *d, yard_nccl_event_descr_v4_t *d4) {
  memset(d4, 0, sizeof *d4);
  d4->type = (uint8_t)d->type;
  d4->parentObj = d->parentObj;
  d4->rank = d->rank;
  if (d->type == YARD_PROFILE_COLL) {
    d4->coll.seqNumber = d->coll.seqNumber;
    d4->coll.func = d->coll.func;
    d4->coll.count = d->coll.count;
    d4->coll.datatype = d->coll.datatype;
    d4->coll.nChannels = d->coll.nChannels;
    d4->coll.algo = d->coll.algo;
    d4->coll.proto = d->coll.proto;
  } else if (d->type == YARD_PROFILE_PROXY_OP) {
    d4->proxyOp.pid = d->proxyOp.pid;
    d4->proxyOp.channelId = d->proxyOp.channelId;
    d4->proxyOp.peer = d->proxyOp.peer;
    d4->proxyOp.nSteps = d->proxyOp.nSteps;
    d4->proxyOp.chunkSize = d->proxyOp.chunkSize;
    d4->proxyOp.isSend = d->proxyOp.isSend;
  } else if (d->type == YARD_PROFILE_PROXY_STEP) {
    d4->proxyStep.step = d->proxyStep.step;
  } else if (d->type == YARD_PROFILE_KERNEL_CH) {
    d4->kernelCh.channelId = d->kernelCh.channelId;
    d4->kernelCh.pTimer = d->kernelCh.pTimer;
  }
}

static void *start(void *ctx, uint64_t type, void *parent, void (*fill)(yard_nccl_event_descr_v5_t *, void *), void *arg) {
  yard_nccl_event_descr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = type;
  d.parentObj = parent;
  d.rank = 0;
  if (fill) fill(&d, arg);
  void *h = NULL;
  if (version == 4) {
    yard_nccl_event_descr_v4_t d4;
    to_v4(&d, &d4);
    prof4->startEvent(ctx, &h, &d4);
  } else {
    prof->startEvent(ctx, &h, &d);
  }
  return h;
}

static void record(void *h, yard_nccl_event_state_t state, yard_nccl_event_state_args_v5_t *args) {
  if (version == 4) {
    yard_nccl_event_state_args_v4_t a4;
    if (args) memcpy(&a4, args, sizeof a4);
    prof4->recordEventState(h, state, args ? &a4 : NULL);
  } else {
    prof->recordEventState(h, state, args);
  }
}

static void stop(void *h) {
  if (version == 4)
    prof4->stopEvent(h);
  else
    prof->stopEvent(h);
}

static void fill_coll(yard_nccl_event_descr_v5_t *d, void *arg) {
  d->coll.seqNumber = *(uint64_t *)arg;
  d->coll.func = "AllReduce";
  d->coll.count = 1024;
  d->coll.datatype = "ncclFloat32";
  d->coll.nChannels = 2;
  d->coll.algo = "RING";
  d->coll.proto = "SIMPLE";
}

static void fill_kernel(yard_nccl_event_descr_v5_t *d, void *arg) {
  d->kernelCh.channelId = (uint8_t)*(int *)arg;
  d->kernelCh.pTimer = 1;
}

static void fill_proxy(yard_nccl_event_descr_v5_t *d, void *arg) {
  d->proxyOp.pid = getpid();
  d->proxyOp.channelId = 0;
  d->proxyOp.peer = 1;
  d->proxyOp.nSteps = 2;
  d->proxyOp.chunkSize = 2048;
  d->proxyOp.isSend = *(int *)arg;
}

static void fill_step(yard_nccl_event_descr_v5_t *d, void *arg) { d->proxyStep.step = *(int *)arg; }

static void run_proxy(void *ctx, void *coll, int is_send) {
  void *op = start(ctx, YARD_PROFILE_PROXY_OP, coll, fill_proxy, &is_send);
  for (int step = 0; step < 2; step++) {
    void *s = start(ctx, YARD_PROFILE_PROXY_STEP, op, fill_step, &step);
    yard_nccl_event_state_args_v5_t args;
    memset(&args, 0, sizeof args);
    args.proxyStep.transSize = 2048;
    if (is_send) {
      record(s, YARD_STATE_PROXY_STEP_SEND_GPU_WAIT, NULL);
      record(s, YARD_STATE_PROXY_STEP_SEND_WAIT, &args);
    } else {
      record(s, YARD_STATE_PROXY_STEP_RECV_WAIT, NULL);
      usleep(1000);
      record(s, YARD_STATE_PROXY_STEP_RECV_FLUSH_WAIT, &args);
      record(s, YARD_STATE_PROXY_STEP_RECV_GPU_WAIT, &args);
    }
    stop(s);
  }
  stop(op);
}

int main(int argc, char **argv) {
  if (argc != 2 && argc != 3) {
    fprintf(stderr, "usage: %s PLUGIN.so [4|5]\n", argv[0]);
    return 2;
  }
  if (argc == 3) version = atoi(argv[2]);
  if (version != 4 && version != 5) {
    fprintf(stderr, "version must be 4 or 5, not %s\n", argv[2]);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  void *ctx = NULL;
  int mask = 0;
  if (version == 4) {
    prof4 = dlsym(lib, "ncclProfiler_v4");
    if (!prof4 || !prof4->init || !prof4->startEvent || !prof4->stopEvent ||
        !prof4->recordEventState || !prof4->finalize) {
      fprintf(stderr, "%s does not export a complete ncclProfiler_v4\n", argv[1]);
      return 1;
    }
    prof4->init(&ctx, &mask, "", 0x1234abcdull, 1, 2, 0, NULL);
  } else {
    prof = dlsym(lib, "ncclProfiler_v5");
    if (!prof || !prof->init || !prof->startEvent || !prof->stopEvent ||
        !prof->recordEventState || !prof->finalize) {
      fprintf(stderr, "%s does not export a complete ncclProfiler_v5\n", argv[1]);
      return 1;
    }
    prof->init(&ctx, 0x1234abcdull, &mask, "", 1, 2, 0, NULL);
  }
  if (!(mask & YARD_PROFILE_COLL) || !(mask & YARD_PROFILE_PROXY_STEP)) {
    fprintf(stderr, "activation mask 0x%x lacks Coll or ProxyStep\n", mask);
    return 1;
  }
  for (uint64_t seq = 0; seq < 2; seq++) {
    void *coll = start(ctx, YARD_PROFILE_COLL, NULL, fill_coll, &seq);
    stop(coll); /* enqueued, not completed */
    void *kernels[2];
    for (int ch = 0; ch < 2; ch++) kernels[ch] = start(ctx, YARD_PROFILE_KERNEL_CH, coll, fill_kernel, &ch);
    run_proxy(ctx, coll, 1);
    run_proxy(ctx, coll, 0);
    for (int ch = 0; ch < 2; ch++) {
      yard_nccl_event_state_args_v5_t args;
      memset(&args, 0, sizeof args);
      args.kernelCh.pTimer = 2;
      record(kernels[ch], YARD_STATE_KERNEL_CH_STOP, &args);
      stop(kernels[ch]);
    }
  }
  /* Events NCCL may send that the plugin ignores. */
  void *ignored = start(ctx, YARD_PROFILE_PROXY_CTRL, NULL, NULL, NULL);
  record(ignored, 13, NULL);
  stop(ignored);
  if (version == 4)
    prof4->finalize(ctx);
  else
    prof->finalize(ctx);

  uint64_t (*dropped)(void) = (uint64_t (*)(void))dlsym(lib, "yard_profiler_dropped");
  printf("dropped %llu\n", dropped ? (unsigned long long)dropped() : 0ull);
  return 0;
}
