"""How soon the CUDA driver reports a trapping kernel's error, by each way of asking.

    python benchmarks/fault_detection.py          # every way, two fresh processes each
    python benchmarks/fault_detection.py --warm 2 --clock64   # after 2 s of kernels; a clock64 spin

A kernel spins on %globaltimer for 0.2 s, then ``__trap()``s; a thread (relaxed
capture mode, the context pushed, as the watchdog's) asks every 1 ms in one of these
ways and prints how long after the trap's time the error first showed:
``ptds_idle`` (the per-thread default stream, as native/watchdog.c asks),
``own_idle`` (an idle stream of its own), ``own_event`` / ``own_event_streamquery``
(an event just recorded on it), ``own_memop`` (a memory write just enqueued on it),
``user_stream`` (the faulting stream itself) and ``ctx_sync_thread``
(``cuCtxSynchronize``).  Each trial is its own process: a context faults once.
``--warm S`` first keeps the GPU busy with kernels for S seconds (one session saw a
trap in a process that had used the GPU for a while about 6 ms after it, against
330-590 ms in fresh processes);
``--clock64`` spins on ``clock64()`` cycles at the device's clock rate instead.
On the H200 (2026-12-01) every way saw it 332-589 ms after the trap
(docs/benchmarks.md, "Device faults").  Needs a GPU; not part of run.py.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

WAYS = (
    "ptds_idle",
    "own_idle",
    "own_event",
    "own_event_streamquery",
    "own_memop",
    "user_stream",
    "ctx_sync_thread",
)
TRAP = r"""
extern "C" __global__ void spin_trap(unsigned long long ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
    __trap();
}

extern "C" __global__ void spin(unsigned long long ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

extern "C" __global__ void spin_cycles_trap(long long cycles)
{
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
    __trap();
}
"""
DELAY = 0.2  # s of device time before the trap


def trial(way: str, warm: float = 0.0, clock64: bool = False) -> str:
    """One process: trap after DELAY, ask `way` every 1 ms, say when the error showed."""
    import numpy as np
    from cuda.bindings import driver as d
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    dev = Device()
    dev.set_current()
    arch = "sm_" + "".join(str(x) for x in dev.compute_capability)
    module = Program(TRAP, code_type="c++", options=ProgramOptions(arch=arch)).compile("cubin")
    kernel = module.get_kernel("spin_cycles_trap" if clock64 else "spin_trap")
    ctx = d.cuCtxGetCurrent()[1]
    stream = dev.create_stream()
    user = d.CUstream(int(stream.handle))
    own = d.cuStreamCreate(1)[1]  # CU_STREAM_NON_BLOCKING
    event = d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING)[1]
    host = d.cuMemHostAlloc(64, 0)[1]

    def ask() -> int:
        if way == "ptds_idle":
            return int(d.cuStreamQuery(d.CUstream(2))[0])  # CU_STREAM_PER_THREAD
        if way == "own_idle":
            return int(d.cuStreamQuery(own)[0])
        if way == "own_event":
            d.cuEventRecord(event, own)
            return int(d.cuEventQuery(event)[0])
        if way == "own_event_streamquery":
            d.cuEventRecord(event, own)
            return int(d.cuStreamQuery(own)[0])
        if way == "own_memop":
            rc = int(d.cuStreamWriteValue32(own, d.CUdeviceptr(int(host)), 1, 0)[0])
            return rc if rc not in (0, 600) else int(d.cuStreamQuery(own)[0])
        if way == "user_stream":
            return int(d.cuStreamQuery(user)[0])
        return int(d.cuCtxSynchronize()[0])  # ctx_sync_thread

    seen: list[tuple[float, int]] = []
    start = time.perf_counter()

    def poll() -> None:  # as the watchdog's thread: relaxed capture mode, context pushed
        d.cuThreadExchangeStreamCaptureMode(d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
        d.cuCtxPushCurrent(ctx)
        while time.perf_counter() - start < 5 and not seen:
            rc = ask()
            if rc not in (0, 600):  # CUDA_SUCCESS, CUDA_ERROR_NOT_READY
                seen.append((time.perf_counter() - start, rc))
            time.sleep(0.001)
        d.cuCtxPopCurrent()

    config = LaunchConfig(grid=1, block=1)
    if warm:
        launch(stream, config, module.get_kernel("spin"), np.uint64(int(warm * 1e9)))
        stream.sync()
        start = time.perf_counter()
    if clock64:  # the device's clock rate, kHz
        attr = d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE
        khz = d.cuDeviceGetAttribute(attr, int(dev.device_id))[1]
        launch(stream, config, kernel, np.int64(int(DELAY * khz * 1e3)))
    else:
        launch(stream, config, kernel, np.uint64(int(DELAY * 1e9)))
    thread = threading.Thread(target=poll)
    thread.start()
    thread.join()
    if not seen:
        return "not found in 5 s"
    return f"found {(seen[0][0] - DELAY) * 1e3:.1f} ms after the trap, code {seen[0][1]}"


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("way", nargs="?", choices=WAYS, help="one trial, in this process")
    parser.add_argument("--warm", type=float, default=0.0, help="seconds of kernels first")
    parser.add_argument("--clock64", action="store_true", help="spin on clock64() cycles")
    args = parser.parse_args()
    if args.way:
        print(trial(args.way, args.warm, args.clock64))
        return
    extra = ["--warm", str(args.warm)] + (["--clock64"] if args.clock64 else [])
    for way in WAYS:
        for _ in range(2):
            run = subprocess.run(
                [sys.executable, __file__, way, *extra],
                capture_output=True,
                text=True,
                timeout=60 + args.warm,
            )
            print(f"{way:22s} {run.stdout.strip()} {run.stderr.strip()[-300:]}")


if __name__ == "__main__":
    main()
