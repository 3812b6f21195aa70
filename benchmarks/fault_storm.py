"""Kernels that trap in several processes at once on one GPU: does the driver report
each fault?  (CUDA only; the figures behind docs/errors.md's known gap.)

Each round starts ``--procs`` children at once; each launches a kernel that spins on
a flag in pinned host memory, sets it, and then polls ``cuStreamQuery`` of the
kernel's stream every 10 ms for ``--wait`` seconds.  Half use the device's default
stream, half a stream of their own.  ``--mode driver`` uses cuda.core and
cuda.bindings only (numba_hostfn is never imported); ``--mode hostfn`` also puts a
``host_launch`` and a ``done_future`` behind the kernel, so the watchdog runs.  Each
child prints what its stream answered, after how long, and how far the kernel got
(1: started, 2: trapping)::

    python benchmarks/fault_storm.py --rounds 3 --mode driver --mode hostfn
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

CHILD = r'''
import ctypes, faulthandler, sys, time
from concurrent.futures import TimeoutError  # Python 3.10's is no builtin one
import numpy as np
from cuda.bindings import driver
from cuda.core import Device, LaunchConfig, LegacyPinnedMemoryResource, Program, ProgramOptions
from cuda.core import launch

which, mode, wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
faulthandler.dump_traceback_later(wait + 20, exit=True)  # a hang says where
# numba_hostfn/_demodevice.py's trap_when_set, copied: importing it imports numba_hostfn.
SOURCE = """
extern "C" __global__ void trap_when_set(volatile int *flag, unsigned long long ns)
{
    unsigned long long start, now;
    flag[1] = 1;
    __threadfence_system();
    while (flag[0] == 0) {
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
    flag[1] = 2;
    __threadfence_system();
    __trap();
}
"""
device = Device()
device.set_current()
arch = "sm_" + "".join(str(x) for x in device.compute_capability)
kernel = (Program(SOURCE, code_type="c++", options=ProgramOptions(arch=arch))
          .compile("cubin").get_kernel("trap_when_set"))
stream = device.default_stream if which == "default" else device.create_stream()
buffer = LegacyPinnedMemoryResource().allocate(8)
flag = np.frombuffer((ctypes.c_char * 8).from_address(int(buffer.handle)), np.int32)
flag[:] = 0
launch(stream, LaunchConfig(grid=1, block=1), kernel, np.uint64(flag.ctypes.data),
       np.uint64(100_000_000))
future = None
if mode == "hostfn":
    import numba_hostfn as nh
    nh.host_launch(stream, lambda: None)
    future = nh.done_future(stream)
start = time.perf_counter()
flag[0] = 1
while True:
    answer = driver.cuStreamQuery(stream.handle)[0]
    if answer != driver.CUresult.CUDA_ERROR_NOT_READY or time.perf_counter() - start > wait:
        break
    time.sleep(0.01)
seconds = time.perf_counter() - start
waited = "-"
if future is not None:
    try:
        future.result(timeout=1.0)
        waited = "resolved"
    except nh.DeviceFaultError as e:
        waited = "raised " + e.error_name
    except TimeoutError:
        waited = "timed out"
print(which, answer.name, f"{seconds:.2f}", int(flag[1]), waited, flush=True)
'''


def child(which: str, mode: str, wait: float) -> tuple[str, str]:
    """A child's outcome (its stream's last answer, with "hung" or "failed" before it
    when it did not exit by itself) and its line, or where it hung."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, which, mode, str(wait)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=wait + 40)
    except subprocess.TimeoutExpired:  # faulthandler did not end it: hung in C at exit
        proc.kill()
        out, err = proc.communicate()
    took = f"(exited after {time.perf_counter() - started:.1f} s, rc={proc.returncode})"
    lines = out.strip().splitlines()
    answer = lines[-1].split()[1] if lines and len(lines[-1].split()) > 1 else "no answer"
    if proc.returncode == 0 and lines:
        return answer, f"{lines[-1]} {took}"
    where = [line.strip() for line in err.splitlines() if line.strip().startswith("File")]
    # Hung: killed here, or ended by its faulthandler ("Timeout (...)!", rc 1, as a
    # Python error's); a child that raised failed, and its error's last line says why.
    timed_out = any(line.startswith("Timeout (") for line in err.splitlines())
    hung = proc.returncode == -9 or timed_out
    why = "" if hung else "".join(" " + line for line in err.strip().splitlines()[-1:])
    outcome = ("hung, " if hung else "failed, ") + answer
    return outcome, f"{which} {' | '.join(lines) or '-'} {took}: {' <- '.join(where[:4])}{why}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=8, help="children a round (8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds a mode (3)")
    parser.add_argument("--wait", type=float, default=20.0, help="seconds a child polls (20)")
    parser.add_argument("--mode", action="append", choices=["driver", "hostfn"])
    args = parser.parse_args(argv)
    for mode in args.mode or ["driver"]:
        tally: Counter[str] = Counter()
        for round_ in range(args.rounds):
            kinds = ["default", "created"] * (args.procs // 2) + ["created"] * (args.procs % 2)
            started = time.perf_counter()
            with ThreadPoolExecutor(args.procs) as pool:
                lines = list(pool.map(child, kinds, [mode] * len(kinds), [args.wait] * len(kinds)))
            print(f"{mode} round {round_ + 1} ({time.perf_counter() - started:.1f} s):")
            for outcome, line in lines:
                print("   ", line)
                tally[outcome] += 1
        print(f"{mode}: {dict(tally)} of {args.rounds * args.procs} children", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
