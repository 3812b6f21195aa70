"""A SIGINT storm over mixed launches: each launch whose call returned runs exactly once.

A thread sends SIGINT to the main thread every 0.1-1 ms while the main thread launches,
in turn, a compiled host function, a Python callable, a non-blocking callback
(``blocking=False``), a ``done_future``, an ``async_done`` wait and a compiled host
function on a HostExecutor, each call in a ``try`` that counts the KeyboardInterrupt
(the SIGINT handler raises it only while a launch is running).
Then, with the storm over, it waits for the stream and checks, per launch:

- a launch whose call returned ran exactly once (its cell counts 1, its future resolved);
- a launch whose call raised ran at most once (the interrupt may have come after its
  enqueue: LIFETIME.md, invariant 3);
- ``pending()`` reaches 0, and nothing is left waiting.

Run it alone (``python tests/storm.py -n 20000 --runs 20``) or from the suite
(``tests/test_interrupts.py``, with fewer launches).  It prints one line per run:
``lost 0 twice 0 pending 0 waiting 0 interrupts N returned R``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import threading
import time

import numpy as np
from numba import carray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _device import Device  # noqa: E402

import numba_hostfn as nh  # noqa: E402

KINDS = ("compiled", "python", "nonblocking", "future", "waits", "executor")


@nh.host_callback
def bump(p):
    carray(p, (1,), np.int64)[0] += 1


def run(n: int, seed: int) -> str:
    device = Device()
    stream = device.create_stream()
    executor = nh.HostExecutor(threads=2)
    loop = asyncio.new_event_loop()
    cells = np.zeros(n, np.int64)  # what each launch did: 1 for once
    returned = np.zeros(n, bool)
    futures: dict[int, object] = {}
    waits: dict[int, asyncio.Future] = {}

    def python(i):
        def call():
            cells[i] += 1

        return call

    def launch(i: int) -> None:
        kind = KINDS[i % len(KINDS)]
        cell = nh.by_ref(cells[i : i + 1])
        if kind == "compiled":
            nh.host_launch(stream, bump, user_data=cell)
        elif kind == "python":
            nh.host_launch(stream, python(i))
        elif kind == "nonblocking":
            nh.host_launch(stream, python(i), blocking=False)
        elif kind == "future":
            futures[i] = nh.done_future(stream)
        elif kind == "waits":  # the loop is this thread's running loop (set below)
            waits[i] = nh.async_done(stream)
        else:
            nh.host_launch(stream, bump, user_data=cell, executor=executor)

    main = threading.get_ident()
    stop = threading.Event()
    rng = random.Random(seed)

    def sender() -> None:
        while not stop.is_set():
            time.sleep(rng.uniform(1e-4, 1e-3))
            signal.pthread_kill(main, signal.SIGINT)

    storm = threading.Thread(target=sender, daemon=True)
    # SIGINT raises KeyboardInterrupt only inside a launch: the handler disarms
    # itself as it raises, so no second interrupt lands in this loop's own
    # bookkeeping (an except clause interrupted again let one escape the script
    # on a loaded machine), and signals that come between launches are dropped.
    armed = [False]

    def on_sigint(signum, frame):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    interrupts = 0
    # async_done needs a running loop; running one under the storm would test
    # asyncio's own handling of KeyboardInterrupt, which loses its state.  So the
    # loop is this thread's running loop without running (asyncio's private
    # setter: test code), and runs once the storm is over.
    asyncio.events._set_running_loop(loop)
    storm.start()
    i = 0
    while i < n:
        armed[0] = True
        try:
            launch(i)
            armed[0] = False  # an interrupt before this counts the launch as raised
            returned[i] = True
        except KeyboardInterrupt:
            interrupts += 1
        i += 1
    armed[0] = False
    stop.set()
    storm.join()

    # Settle, with the storm over.
    asyncio.events._set_running_loop(None)
    stream.sync()
    for i, future in futures.items():
        if future.result(30) is stream:
            cells[i] += 1

    async def resolved():
        for i, w in waits.items():
            if await asyncio.wait_for(w, 30) is stream:
                cells[i] += 1

    loop.run_until_complete(resolved())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        nh.drain()
        if nh.pending() == 0 and all(cells[returned] == 1):
            break
        time.sleep(0.01)
    waiting = nh._notify._callbacks.outstanding() if nh._notify._callbacks else 0
    lost = int(np.sum(cells[returned] == 0))
    twice = int(np.sum(cells > 1))
    executor.close()
    loop.close()
    device.close_stream(stream)
    signal.signal(signal.SIGINT, previous)  # the storm's last signals were dropped
    return (
        f"lost {lost} twice {twice} pending {nh.pending()} waiting {waiting} "
        f"interrupts {interrupts} returned {int(returned.sum())}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20000, help="launches per run")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    nh.simulate_without_gpu()
    bad = 0
    for r in range(args.runs):
        line = run(args.n, args.seed + r)
        print(f"run {r + 1}: {line}", flush=True)
        bad += not line.startswith("lost 0 twice 0 pending 0 waiting 0 ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
