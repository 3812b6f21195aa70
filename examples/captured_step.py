# What this shows: host work inside a captured, replayed step. A "decode step" is
# captured once with torch.cuda.graph: a matrix product on the GPU, a copy of its
# result into pinned host memory, and a compiled host function that post-processes
# it there (the argmax, appended to a log of chosen ids) without the GIL. Every
# replay runs the whole step in stream order; the graph owns the host node's user
# data, and nothing synchronizes between steps.
#
# Needs a GPU (PyTorch's CUDA graphs).

import sys

import numpy as np
from numba import carray

import numba_hostfn as nh

STEPS = 64
HIDDEN, VOCAB = 256, 4096
# The host node's user data: where the logits land, how many, and the log of ids.
PICK = np.dtype([("logits", np.uint64), ("n", np.int64), ("ids", np.uint64), ("count", np.int64)])


@nh.host_callback(dtype=PICK)
def pick(d):
    logits = carray(nh.as_voidptr(d.logits), (d.n,), np.float32)
    best = 0
    for i in range(1, d.n):
        if logits[i] > logits[best]:
            best = i
    carray(nh.as_voidptr(d.ids), (STEPS,), np.int64)[d.count] = best
    d.count += 1


def main() -> int:
    if nh.backend_name() == "simulator":
        raise SystemExit("captured_step.py needs a GPU: it captures with torch.cuda.graph")
    import torch

    torch.manual_seed(0)
    weights = torch.randn(HIDDEN, VOCAB, device="cuda")
    hidden = torch.zeros(1, HIDDEN, device="cuda")  # the step's static input
    host_logits = torch.empty(VOCAB, dtype=torch.float32, pin_memory=True)
    ids = np.full(STEPS, -1, np.int64)
    state = np.zeros(1, PICK)
    state[0] = (host_logits.data_ptr(), VOCAB, ids.ctypes.data, 0)

    side = torch.cuda.Stream()  # warm up before capture, as PyTorch recommends
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            hidden @ weights
    torch.cuda.current_stream().wait_stream(side)

    step = torch.cuda.CUDAGraph()
    with torch.cuda.graph(step):
        logits = (hidden @ weights)[0]
        host_logits.copy_(logits, non_blocking=True)
        nh.host_launch(torch.cuda.current_stream(), pick, user_data=nh.by_ref(state))

    expected = []
    for _ in range(STEPS):
        hidden.copy_(torch.randn(1, HIDDEN, device="cuda"))
        step.replay()
        expected.append(torch.argmax(logits))  # on the GPU, from the same logits
    torch.cuda.synchronize()
    expected = [int(i) for i in expected]
    ok = ids.tolist() == expected and int(state[0]["count"]) == STEPS
    print(f"{STEPS} replays of the captured step; host argmax matches the GPU's: {ok}")
    print("OK" if ok else "WRONG")
    del step  # its host node's user data is released on the main thread
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
