"""yard_agg's DDP hook when the job changes under it, for ``test_agg_torch_real.py``: one
gloo rank (world 1) trains a tiny model through the hook, joined to a fake agent given by the
test. ``gone``: the aggregator never answers and the agent says the job was deleted; the
backward pass must raise naming the job and the reason. ``regroup``: the first aggregator
goes silent and the agent moves the job to a second one at a new epoch; training must go on.
Prints one JSON line with what happened."""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import yard_agg  # noqa: E402


def main():
    mode, agent, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        init = "tcp://127.0.0.1:%d" % s.getsockname()[1]
    dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    torch.manual_seed(3)
    model = nn.parallel.DistributedDataParallel(nn.Linear(10, 3))
    state = yard_agg.HookState("t", 0, ("127.0.0.1", port), path=agent,
                               tuning=yard_agg.Tuning(give_up=0.3), round_timeout=20)
    model.register_comm_hook(state, yard_agg.hook)
    x, y = torch.ones(4, 10), torch.zeros(4, 3)
    out = {"steps": 0}
    try:
        for _ in range(3):
            nn.functional.mse_loss(model(x), y).backward()
            out["steps"] += 1
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["error"] = "%s: %s" % (type(e).__name__, e)
    out["regroups"] = state.regroups
    out["epoch"] = state.worker.membership.epoch
    out["grad"] = [float(v) for v in model.module.bias.grad]
    print(json.dumps(out), flush=True)
    state.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
