"""Gradient aggregation through Switchyard's aggregator (XAgg), from a Python worker.

- :mod:`yard_agg.wire`: the frame format (docs/aggregation-protocol.md), byte for byte the
  Rust client's (``clients/agg``).
- :mod:`yard_agg.fixed`: float32 gradients as block fixed point, bit-identical to the Rust
  client's, pure Python or vectorised with torch.
- :mod:`yard_agg.session`: joining a job through the local ``yard`` node's agent socket and
  following its membership.
- :mod:`yard_agg.worker`: one round's all-reduce over UDP: windowed sending, timeouts with
  retransmission, results in any order, replay after a regrouping.
- :mod:`yard_agg.torch`: the DDP communication hook (``hook``, ``HookState``).

Pure standard library; torch is imported only by the hook and the ``*_tensor`` functions.
"""

from .session import Membership, Session, SessionError
from .wire import Geometry
from .worker import AggError, AggTimeout, Tuning, Worker
from .torch import AggJobError, HookState, hook

__all__ = ["AggError", "AggJobError", "AggTimeout", "Geometry", "HookState", "Membership",
           "Session", "SessionError", "Tuning", "Worker", "hook"]
