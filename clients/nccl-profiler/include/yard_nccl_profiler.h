/*
 * NCCL's profiler plugin ABI, interface versions 4 and 5, declared here in our own words.
 * NCCL looks up the table by the symbol name `ncclProfiler_v5` since NCCL 2.28.3 (2.29 and
 * later prefer v6 but still load v5 through an adapter), and `ncclProfiler_v4` from 2.27 on:
 * 2.27, which PyTorch 2.8 wheels bundle, knows nothing newer. A loader takes the newest
 * version it knows, so each NCCL finds one of the two. Layouts must match NCCL's exactly:
 * NCCL fills these structs and calls through the function table. So every struct member is
 * declared, read by the plugin or not, and test/check-abi.sh (`make check-abi`) checks sizes,
 * offsets, types, enum values and signatures against NCCL's own headers. Of the enums, only
 * the values the plugin uses are named; they are the same numbers in v4 and v5.
 */
#ifndef YARD_NCCL_PROFILER_H
#define YARD_NCCL_PROFILER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ncclResult_t: only success matters to a plugin that never fails NCCL. */
typedef enum { yardNcclSuccess = 0 } yard_nccl_result_t;

/* NCCL's logger callback (level, subsystem flags, file, line, printf format). */
typedef void (*yard_nccl_logger_t)(int level, unsigned long flags, const char *file, int line,
                                   const char *fmt, ...);

/* Event type bits (ncclProfile*), used in the descriptor's `type` and the activation mask. */
enum {
  YARD_PROFILE_GROUP = 1 << 0,
  YARD_PROFILE_COLL = 1 << 1,
  YARD_PROFILE_P2P = 1 << 2,
  YARD_PROFILE_PROXY_OP = 1 << 3,
  YARD_PROFILE_PROXY_STEP = 1 << 4,
  YARD_PROFILE_PROXY_CTRL = 1 << 5,
  YARD_PROFILE_KERNEL_CH = 1 << 6,
  YARD_PROFILE_NET_PLUGIN = 1 << 7,
  YARD_PROFILE_GROUP_API = 1 << 8,
  YARD_PROFILE_COLL_API = 1 << 9,
  YARD_PROFILE_P2P_API = 1 << 10,
  YARD_PROFILE_KERNEL_LAUNCH = 1 << 11,
};

/* Event states (ncclProfilerEventState_t values) the plugin distinguishes. */
typedef enum {
  YARD_STATE_PROXY_STEP_SEND_GPU_WAIT = 8,
  YARD_STATE_PROXY_STEP_SEND_WAIT = 9,
  YARD_STATE_PROXY_STEP_RECV_WAIT = 10,
  YARD_STATE_PROXY_STEP_RECV_FLUSH_WAIT = 11,
  YARD_STATE_PROXY_STEP_RECV_GPU_WAIT = 12,
  YARD_STATE_PROXY_STEP_SEND_PEER_WAIT = 20,
  YARD_STATE_KERNEL_CH_STOP = 22,
} yard_nccl_event_state_t;

/* ncclProfilerEventDescr_v5_t */
typedef struct {
  uint64_t type;
  void *parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char *func;
      size_t count;
      const char *datatype;
      int root;
      void *stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char *func;
      size_t count;
      const char *datatype;
      void *stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void *stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char *func;
      const void *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char *algo;
      const char *proto;
      void *parentGroup;
    } coll;
    struct {
      const char *func;
      void *buff;
      const char *datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void *parentGroup;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void *data;
    } netPlugin;
  };
} yard_nccl_event_descr_v5_t;

/* ncclProfilerEventStateArgs_v5_t */
typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void *data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
} yard_nccl_event_state_args_v5_t;

/* ncclProfiler_v5_t: the table exported as the symbol `ncclProfiler_v5`. */
typedef struct {
  const char *name;
  yard_nccl_result_t (*init)(void **context, uint64_t commId, int *eActivationMask,
                             const char *commName, int nNodes, int nranks, int rank,
                             yard_nccl_logger_t logfn);
  yard_nccl_result_t (*startEvent)(void *context, void **eHandle,
                                   yard_nccl_event_descr_v5_t *eDescr);
  yard_nccl_result_t (*stopEvent)(void *eHandle);
  yard_nccl_result_t (*recordEventState)(void *eHandle, yard_nccl_event_state_t eState,
                                         yard_nccl_event_state_args_v5_t *eStateArgs);
  yard_nccl_result_t (*finalize)(void *context);
} yard_nccl_profiler_v5_t;

/* ncclProfilerEventDescr_v4_t: a one-byte type, no API or kernel-launch events, and no
 * parentGroup in coll and p2p. */
typedef struct {
  uint8_t type;
  void *parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char *func;
      const void *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char *algo;
      const char *proto;
    } coll;
    struct {
      const char *func;
      void *buff;
      const char *datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void *data;
    } netPlugin;
  };
} yard_nccl_event_descr_v4_t;

/* ncclProfilerEventStateArgs_v4_t: the same members as v5's, a type of its own in NCCL. */
typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void *data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
} yard_nccl_event_state_args_v4_t;

/* ncclProfiler_v4_t: init takes the activation mask before the communicator's name and hash,
 * where v5 takes the hash first. */
typedef struct {
  const char *name;
  yard_nccl_result_t (*init)(void **context, int *eActivationMask, const char *commName,
                             uint64_t commHash, int nNodes, int nranks, int rank,
                             yard_nccl_logger_t logfn);
  yard_nccl_result_t (*startEvent)(void *context, void **eHandle,
                                   yard_nccl_event_descr_v4_t *eDescr);
  yard_nccl_result_t (*stopEvent)(void *eHandle);
  yard_nccl_result_t (*recordEventState)(void *eHandle, yard_nccl_event_state_t eState,
                                         yard_nccl_event_state_args_v4_t *eStateArgs);
  yard_nccl_result_t (*finalize)(void *context);
} yard_nccl_profiler_v4_t;

#endif
