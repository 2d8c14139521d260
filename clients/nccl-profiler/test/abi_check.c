/*
 * Compile-time check of include/yard_nccl_profiler.h against NCCL's own profiler headers.
 *
 * Our header is declared independently (no NCCL text is in this repository), so nothing but
 * this check ties it to the layout NCCL compiles against. test/check-abi.sh fetches NCCL's
 * source from Debian's nvidia-nccl source package and compiles this file twice; it produces
 * no object, only errors:
 *   - with YARD_ABI_NCCL_INTERNAL, as C++, against the headers libnccl itself is built with
 *     (src/include/plugin/nccl_profiler.h), the ones its loader really uses; C++ so that
 *     function signatures can be compared too;
 *   - as C, against the copies NCCL ships for plugin authors
 *     (plugins/profiler/example/nccl/, ext-profiler/example/nccl/ before NCCL 2.29.7).
 * Each interface version the plugin exports gets a block below; check-abi.sh also checks that
 * the .so exports exactly those ncclProfiler_v<N> symbols, since NCCL's loader dlsym()s the
 * newest version it knows first and would otherwise pick an unchecked table.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "yard_nccl_profiler.h"

/* NCCL's headers expect ncclResult_t and ncclDebugLogger_t to be declared already; in libnccl
 * they come from nccl.h and nccl_common.h, for plugins from the example's err.h and common.h,
 * which declare the same types. */
#include "err.h"
#include "common.h"
#ifdef YARD_ABI_NCCL_INTERNAL
#include <type_traits>
#include "nccl_profiler.h"
#define SAME_TYPE(a, b) std::is_same<a, b>::value
#define STATIC_ASSERT static_assert
#else
#include "profiler.h"
#define SAME_TYPE(a, b) __builtin_types_compatible_p(a, b)
#define STATIC_ASSERT _Static_assert
#endif

#define MEMBER_TYPE(t, m) __typeof__(((t *)0)->m)

/* Same offset and size: enough for the function table, whose members use our own stand-ins
 * for NCCL's enums (sizes checked separately below). */
#define SAME_SLOT(ours, theirs, m)                                                      \
  STATIC_ASSERT(offsetof(ours, m) == offsetof(theirs, m), #ours "." #m ": offset");     \
  STATIC_ASSERT(sizeof(MEMBER_TYPE(ours, m)) == sizeof(MEMBER_TYPE(theirs, m)),         \
                #ours "." #m ": size")

/* Data members must also have the same type: same size alone would let int stand for
 * unsigned, or uint8_t for bool. */
#define SAME_FIELD(ours, theirs, m) \
  SAME_SLOT(ours, theirs, m);       \
  STATIC_ASSERT(SAME_TYPE(MEMBER_TYPE(ours, m), MEMBER_TYPE(theirs, m)), #ours "." #m ": type")

#define SAME_LAYOUT(ours, theirs)                                \
  STATIC_ASSERT(sizeof(ours) == sizeof(theirs), #ours ": size"); \
  STATIC_ASSERT(__alignof__(ours) == __alignof__(theirs), #ours ": alignment")

#ifdef YARD_ABI_NCCL_INTERNAL
/* Function signatures, parameter by parameter: sizes and offsets cannot see two parameters
 * swapped (NCCL reordered init's between v4 and v5). Our stand-ins for NCCL's types are
 * mapped to NCCL's first; C has no way to do that, so this runs in the C++ pass only. */
template <class T> struct nccl_of {
  typedef T type;
};
template <> struct nccl_of<yard_nccl_result_t> {
  typedef ncclResult_t type;
};
template <> struct nccl_of<yard_nccl_event_state_t> {
  typedef ncclProfilerEventState_t type;
};
template <> struct nccl_of<yard_nccl_logger_t> {
  typedef ncclDebugLogger_t type; /* its level parameter: size checked below */
};
template <> struct nccl_of<yard_nccl_event_descr_v5_t *> {
  typedef ncclProfilerEventDescr_v5_t *type;
};
template <> struct nccl_of<yard_nccl_event_state_args_v5_t *> {
  typedef ncclProfilerEventStateArgs_v5_t *type;
};
template <> struct nccl_of<yard_nccl_event_descr_v4_t *> {
  typedef ncclProfilerEventDescr_v4_t *type;
};
template <> struct nccl_of<yard_nccl_event_state_args_v4_t *> {
  typedef ncclProfilerEventStateArgs_v4_t *type;
};
template <class R, class... A> struct nccl_of<R (*)(A...)> {
  typedef typename nccl_of<R>::type (*type)(typename nccl_of<A>::type...);
};
#define SAME_SIGNATURE(ours, theirs, m)                                                      \
  static_assert(std::is_same<nccl_of<decltype(ours::m)>::type, decltype(theirs::m)>::value, \
                #ours "." #m ": signature")
#endif

#define SAME_VALUE(ours, theirs) STATIC_ASSERT((long)(ours) == (long)(theirs), #ours " value")

/* Scalars behind the function table's parameters and results. */
STATIC_ASSERT(sizeof(yard_nccl_result_t) == sizeof(ncclResult_t), "ncclResult_t size");
SAME_VALUE(yardNcclSuccess, ncclSuccess);
STATIC_ASSERT(sizeof(int) == sizeof(ncclDebugLogLevel), "logger level size");

/* Event type bits (the descriptor's type and the activation mask); the states we name. */
SAME_VALUE(YARD_PROFILE_GROUP, ncclProfileGroup);
SAME_VALUE(YARD_PROFILE_COLL, ncclProfileColl);
SAME_VALUE(YARD_PROFILE_P2P, ncclProfileP2p);
SAME_VALUE(YARD_PROFILE_PROXY_OP, ncclProfileProxyOp);
SAME_VALUE(YARD_PROFILE_PROXY_STEP, ncclProfileProxyStep);
SAME_VALUE(YARD_PROFILE_PROXY_CTRL, ncclProfileProxyCtrl);
SAME_VALUE(YARD_PROFILE_KERNEL_CH, ncclProfileKernelCh);
SAME_VALUE(YARD_PROFILE_NET_PLUGIN, ncclProfileNetPlugin);
SAME_VALUE(YARD_PROFILE_GROUP_API, ncclProfileGroupApi);
SAME_VALUE(YARD_PROFILE_COLL_API, ncclProfileCollApi);
SAME_VALUE(YARD_PROFILE_P2P_API, ncclProfileP2pApi);
SAME_VALUE(YARD_PROFILE_KERNEL_LAUNCH, ncclProfileKernelLaunch);

SAME_VALUE(YARD_STATE_PROXY_STEP_SEND_GPU_WAIT, ncclProfilerProxyStepSendGPUWait);
SAME_VALUE(YARD_STATE_PROXY_STEP_SEND_WAIT, ncclProfilerProxyStepSendWait);
SAME_VALUE(YARD_STATE_PROXY_STEP_RECV_WAIT, ncclProfilerProxyStepRecvWait);
SAME_VALUE(YARD_STATE_PROXY_STEP_RECV_FLUSH_WAIT, ncclProfilerProxyStepRecvFlushWait);
SAME_VALUE(YARD_STATE_PROXY_STEP_RECV_GPU_WAIT, ncclProfilerProxyStepRecvGPUWait);
SAME_VALUE(YARD_STATE_PROXY_STEP_SEND_PEER_WAIT, ncclProfilerProxyStepSendPeerWait_v4);
SAME_VALUE(YARD_STATE_KERNEL_CH_STOP, ncclProfilerKernelChStop);

/* ---- interface v5 (symbol ncclProfiler_v5) ---- */
STATIC_ASSERT(sizeof(yard_nccl_event_state_t) == sizeof(ncclProfilerEventState_v5_t),
              "v5 event state size");

typedef yard_nccl_event_descr_v5_t our_d5;
typedef ncclProfilerEventDescr_v5_t nccl_d5;
SAME_LAYOUT(our_d5, nccl_d5);
SAME_FIELD(our_d5, nccl_d5, type);
SAME_FIELD(our_d5, nccl_d5, parentObj);
SAME_FIELD(our_d5, nccl_d5, rank);
SAME_FIELD(our_d5, nccl_d5, groupApi.graphCaptured);
SAME_FIELD(our_d5, nccl_d5, groupApi.groupDepth);
SAME_FIELD(our_d5, nccl_d5, collApi.func);
SAME_FIELD(our_d5, nccl_d5, collApi.count);
SAME_FIELD(our_d5, nccl_d5, collApi.datatype);
SAME_FIELD(our_d5, nccl_d5, collApi.root);
SAME_FIELD(our_d5, nccl_d5, collApi.stream);
SAME_FIELD(our_d5, nccl_d5, collApi.graphCaptured);
SAME_FIELD(our_d5, nccl_d5, p2pApi.func);
SAME_FIELD(our_d5, nccl_d5, p2pApi.count);
SAME_FIELD(our_d5, nccl_d5, p2pApi.datatype);
SAME_FIELD(our_d5, nccl_d5, p2pApi.stream);
SAME_FIELD(our_d5, nccl_d5, p2pApi.graphCaptured);
SAME_FIELD(our_d5, nccl_d5, kernelLaunch.stream);
SAME_FIELD(our_d5, nccl_d5, coll.seqNumber);
SAME_FIELD(our_d5, nccl_d5, coll.func);
SAME_FIELD(our_d5, nccl_d5, coll.sendBuff);
SAME_FIELD(our_d5, nccl_d5, coll.recvBuff);
SAME_FIELD(our_d5, nccl_d5, coll.count);
SAME_FIELD(our_d5, nccl_d5, coll.root);
SAME_FIELD(our_d5, nccl_d5, coll.datatype);
SAME_FIELD(our_d5, nccl_d5, coll.nChannels);
SAME_FIELD(our_d5, nccl_d5, coll.nWarps);
SAME_FIELD(our_d5, nccl_d5, coll.algo);
SAME_FIELD(our_d5, nccl_d5, coll.proto);
SAME_FIELD(our_d5, nccl_d5, coll.parentGroup);
SAME_FIELD(our_d5, nccl_d5, p2p.func);
SAME_FIELD(our_d5, nccl_d5, p2p.buff);
SAME_FIELD(our_d5, nccl_d5, p2p.datatype);
SAME_FIELD(our_d5, nccl_d5, p2p.count);
SAME_FIELD(our_d5, nccl_d5, p2p.peer);
SAME_FIELD(our_d5, nccl_d5, p2p.nChannels);
SAME_FIELD(our_d5, nccl_d5, p2p.parentGroup);
SAME_FIELD(our_d5, nccl_d5, proxyOp.pid);
SAME_FIELD(our_d5, nccl_d5, proxyOp.channelId);
SAME_FIELD(our_d5, nccl_d5, proxyOp.peer);
SAME_FIELD(our_d5, nccl_d5, proxyOp.nSteps);
SAME_FIELD(our_d5, nccl_d5, proxyOp.chunkSize);
SAME_FIELD(our_d5, nccl_d5, proxyOp.isSend);
SAME_FIELD(our_d5, nccl_d5, proxyStep.step);
SAME_FIELD(our_d5, nccl_d5, kernelCh.channelId);
SAME_FIELD(our_d5, nccl_d5, kernelCh.pTimer);
SAME_FIELD(our_d5, nccl_d5, netPlugin.id);
SAME_FIELD(our_d5, nccl_d5, netPlugin.data);

typedef yard_nccl_event_state_args_v5_t our_a5;
typedef ncclProfilerEventStateArgs_v5_t nccl_a5;
SAME_LAYOUT(our_a5, nccl_a5);
SAME_FIELD(our_a5, nccl_a5, proxyStep.transSize);
SAME_FIELD(our_a5, nccl_a5, proxyCtrl.appendedProxyOps);
SAME_FIELD(our_a5, nccl_a5, netPlugin.data);
SAME_FIELD(our_a5, nccl_a5, kernelCh.pTimer);

typedef yard_nccl_profiler_v5_t our_p5;
typedef ncclProfiler_v5_t nccl_p5;
SAME_LAYOUT(our_p5, nccl_p5);
SAME_FIELD(our_p5, nccl_p5, name);
SAME_SLOT(our_p5, nccl_p5, init);
SAME_SLOT(our_p5, nccl_p5, startEvent);
SAME_SLOT(our_p5, nccl_p5, stopEvent);
SAME_SLOT(our_p5, nccl_p5, recordEventState);
SAME_SLOT(our_p5, nccl_p5, finalize);
#ifdef YARD_ABI_NCCL_INTERNAL
SAME_SIGNATURE(our_p5, nccl_p5, init);
SAME_SIGNATURE(our_p5, nccl_p5, startEvent);
SAME_SIGNATURE(our_p5, nccl_p5, stopEvent);
SAME_SIGNATURE(our_p5, nccl_p5, recordEventState);
SAME_SIGNATURE(our_p5, nccl_p5, finalize);
#endif

/* ---- interface v4 (symbol ncclProfiler_v4, NCCL 2.27) ---- */
STATIC_ASSERT(sizeof(yard_nccl_event_state_t) == sizeof(ncclProfilerEventState_v4_t),
              "v4 event state size");

typedef yard_nccl_event_descr_v4_t our_d4;
typedef ncclProfilerEventDescr_v4_t nccl_d4;
SAME_LAYOUT(our_d4, nccl_d4);
SAME_FIELD(our_d4, nccl_d4, type);
SAME_FIELD(our_d4, nccl_d4, parentObj);
SAME_FIELD(our_d4, nccl_d4, rank);
SAME_FIELD(our_d4, nccl_d4, coll.seqNumber);
SAME_FIELD(our_d4, nccl_d4, coll.func);
SAME_FIELD(our_d4, nccl_d4, coll.sendBuff);
SAME_FIELD(our_d4, nccl_d4, coll.recvBuff);
SAME_FIELD(our_d4, nccl_d4, coll.count);
SAME_FIELD(our_d4, nccl_d4, coll.root);
SAME_FIELD(our_d4, nccl_d4, coll.datatype);
SAME_FIELD(our_d4, nccl_d4, coll.nChannels);
SAME_FIELD(our_d4, nccl_d4, coll.nWarps);
SAME_FIELD(our_d4, nccl_d4, coll.algo);
SAME_FIELD(our_d4, nccl_d4, coll.proto);
SAME_FIELD(our_d4, nccl_d4, p2p.func);
SAME_FIELD(our_d4, nccl_d4, p2p.buff);
SAME_FIELD(our_d4, nccl_d4, p2p.datatype);
SAME_FIELD(our_d4, nccl_d4, p2p.count);
SAME_FIELD(our_d4, nccl_d4, p2p.peer);
SAME_FIELD(our_d4, nccl_d4, p2p.nChannels);
SAME_FIELD(our_d4, nccl_d4, proxyOp.pid);
SAME_FIELD(our_d4, nccl_d4, proxyOp.channelId);
SAME_FIELD(our_d4, nccl_d4, proxyOp.peer);
SAME_FIELD(our_d4, nccl_d4, proxyOp.nSteps);
SAME_FIELD(our_d4, nccl_d4, proxyOp.chunkSize);
SAME_FIELD(our_d4, nccl_d4, proxyOp.isSend);
SAME_FIELD(our_d4, nccl_d4, proxyStep.step);
SAME_FIELD(our_d4, nccl_d4, kernelCh.channelId);
SAME_FIELD(our_d4, nccl_d4, kernelCh.pTimer);
SAME_FIELD(our_d4, nccl_d4, netPlugin.id);
SAME_FIELD(our_d4, nccl_d4, netPlugin.data);

typedef yard_nccl_event_state_args_v4_t our_a4;
typedef ncclProfilerEventStateArgs_v4_t nccl_a4;
SAME_LAYOUT(our_a4, nccl_a4);
SAME_FIELD(our_a4, nccl_a4, proxyStep.transSize);
SAME_FIELD(our_a4, nccl_a4, proxyCtrl.appendedProxyOps);
SAME_FIELD(our_a4, nccl_a4, netPlugin.data);
SAME_FIELD(our_a4, nccl_a4, kernelCh.pTimer);

typedef yard_nccl_profiler_v4_t our_p4;
typedef ncclProfiler_v4_t nccl_p4;
SAME_LAYOUT(our_p4, nccl_p4);
SAME_FIELD(our_p4, nccl_p4, name);
SAME_SLOT(our_p4, nccl_p4, init);
SAME_SLOT(our_p4, nccl_p4, startEvent);
SAME_SLOT(our_p4, nccl_p4, stopEvent);
SAME_SLOT(our_p4, nccl_p4, recordEventState);
SAME_SLOT(our_p4, nccl_p4, finalize);
#ifdef YARD_ABI_NCCL_INTERNAL
SAME_SIGNATURE(our_p4, nccl_p4, init);
SAME_SIGNATURE(our_p4, nccl_p4, startEvent);
SAME_SIGNATURE(our_p4, nccl_p4, stopEvent);
SAME_SIGNATURE(our_p4, nccl_p4, recordEventState);
SAME_SIGNATURE(our_p4, nccl_p4, finalize);
#endif
