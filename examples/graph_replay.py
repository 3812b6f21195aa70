# What this shows: a compiled host function as a node of a CUDA graph, captured once
# through a cuda.core GraphBuilder and replayed many times. Each replay runs the host
# node (without the GIL) on its user data -- here a running count and sum of what a
# kernel produced -- and the graph keeps that user data alive as long as it exists.
#
# Needs a GPU (its kernel is CUDA C++, compiled with NVRTC).

import ctypes
import sys

import numpy as np
from numba import carray

import numba_hostfn as nh

REPLAYS = 100
ACCUMULATE = np.dtype([("value", np.uint64), ("count", np.int64), ("sum", np.int64)])

KERNEL = r"""
extern "C" __global__ void next_value(int *value)
{
    *(volatile int *)value += 1;
    __threadfence_system();  // visible to the host node that follows
}
"""


@nh.host_callback(dtype=ACCUMULATE)
def accumulate(a):
    a.count += 1
    a.sum += carray(nh.as_voidptr(a.value), (1,), np.int32)[0]


def main() -> int:
    if nh.backend_name() == "simulator":
        raise SystemExit("graph_replay.py needs a GPU: its kernel is CUDA C++")
    from cuda.core import (
        Device,
        LaunchConfig,
        LegacyPinnedMemoryResource,
        Program,
        ProgramOptions,
        launch,
    )

    device = Device()
    device.set_current()
    stream = device.create_stream()
    arch = "sm_" + "".join(str(v) for v in device.compute_capability)
    kernel = Program(KERNEL, code_type="c++", options=ProgramOptions(arch=arch))
    kernel = kernel.compile("cubin").get_kernel("next_value")
    cell = LegacyPinnedMemoryResource().allocate(4)
    value = np.frombuffer((ctypes.c_char * 4).from_address(int(cell.handle)), np.int32)
    value[0] = 0
    state = np.zeros(1, ACCUMULATE)
    state[0]["value"] = value.ctypes.data

    builder = stream.create_graph_builder().begin_building()
    launch(builder, LaunchConfig(grid=1, block=1), kernel, np.uint64(value.ctypes.data))
    nh.host_launch(builder, accumulate, user_data=nh.by_ref(state))  # a host node
    graph = builder.end_building().complete()
    try:
        for _ in range(REPLAYS):
            graph.launch(stream)
        stream.sync()
        count, total = int(state[0]["count"]), int(state[0]["sum"])
        ok = count == REPLAYS and total == REPLAYS * (REPLAYS + 1) // 2
        print(
            f"{REPLAYS} replays: the host node ran {count} times, summed {total} "
            f"-> {'OK' if ok else 'WRONG'}"
        )
        return 0 if ok else 1
    finally:
        graph.close()
        builder.close()
        stream.sync()
        cell.close()
        stream.close()


if __name__ == "__main__":
    sys.exit(main())
