# What this shows: an asyncio server that handles several requests at once, each on
# its own stream. A handler launches its request's kernel (which writes pinned memory),
# then awaits numba_hostfn.async_done(stream): that suspends the handler, not the
# loop. When the stream gets there, numba_hostfn's default lane (a native thread of
# its own, or the driver's thread where that lane cannot serve) writes the loop's
# eventfd without the GIL, and the loop resumes the handler. The
# loop keeps serving meanwhile: it accepts and answers the other requests, and a
# ticker counts the loop's turns while kernels are in flight. A non-blocking callback
# (host_launch(..., blocking=False)) keeps the books: the stream does not wait for it.
# The kernels are numba-cuda's (numba.cuda.jit), each on a numba-cuda stream. Runs on
# a GPU with numba-cuda (pip install -e ".[cuda]"), or on the simulator with
# NUMBA_HOSTFN_SIMULATOR=1 (where the "kernels" are stream sleeps and compiled
# functions run as stream work).

import asyncio
import functools
import sys
import threading
import time

import numpy as np
from numba import carray

import numba_hostfn as nh

# A request is "seed units". Its kernel sets out[i] to seed + i stepped `rounds` times
# through a 32-bit linear congruential generator, rounds = units x the backend's rounds
# per unit (so units set the device time); the reply is the sum of out.
N = 1 << 17  # values per request
A, C, MASK = 1664525, 1013904223, 0xFFFFFFFF
REQUESTS = list(enumerate((3, 1, 2, 1, 3, 2, 1, 2), start=100))  # (seed, units)
SLOTS = 4  # streams (with their buffers) the server keeps: requests in flight at once


def jump(rounds: int) -> tuple[int, int]:
    """(a, c) such that v -> (a * v + c) & MASK is `rounds` steps at once."""
    a, c, step_a, step_c = 1, 0, A, C
    while rounds:
        if rounds & 1:
            a, c = step_a * a & MASK, (step_a * c + step_c) & MASK
        step_a, step_c = step_a * step_a & MASK, (step_a * step_c + step_c) & MASK
        rounds >>= 1
    return a, c


def expected(seed: int, rounds: int) -> int:
    a, c = jump(rounds)
    v = np.arange(seed, seed + N, dtype=np.uint64)
    return int(((v * np.uint64(a) + np.uint64(c)) & np.uint64(MASK)).sum())


def numba_cuda():
    """numba.cuda, to write the kernels in Python (``pip install -e ".[cuda]"``).

    numba-cuda 0.30.4 registers an overload of ``np.row_stack``, which NumPy 2.5
    removed, when it compiles its first kernel; numba-cuda is in maintenance and
    will not change that (NVIDIA/numba-cuda#907). Give it back the alias it reads.
    """
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    from numba import cuda

    return cuda


def gpu_setup():
    cuda = numba_cuda()

    @cuda.jit
    def respond(out, seed, rounds):
        i = cuda.grid(1)
        if i < out.size:
            v = np.uint64(seed) + np.uint64(i)
            for _ in range(rounds):
                v = (v * np.uint64(A) + np.uint64(C)) & np.uint64(MASK)
            out[i] = v  # pinned host memory, written by the GPU

    def slot():
        # Allocated up front: allocating while other streams run may synchronize them.
        stream = cuda.stream()  # a numba-cuda stream: async_done takes it as it is
        answer = cuda.mapped_array(N, np.uint64)

        def start(seed, rounds):
            respond[N // 256, 256, stream](answer, np.uint64(seed), np.int64(rounds))

        return stream, start, answer

    slots = [slot() for _ in range(SLOTS)]
    stream, start, _ = slots[0]
    start(0, 1)  # compile the kernel now, not while the loop serves
    stream.synchronize()

    def cleanup():
        for stream, _, _ in slots:
            stream.synchronize()

    return slots, 200_000, cleanup  # rounds per unit


def simulator_setup():
    request = np.dtype(
        [("out", np.uint64), ("n", np.int64), ("seed", np.int64), ("rounds", np.int64)]
    )

    @nh.host_callback(dtype=request)
    def respond(r):  # the simulated kernel writes host memory directly
        out = carray(nh.as_voidptr(r.out), (r.n,), np.uint64)
        for i in range(r.n):
            v = np.uint64(r.seed + i)
            for _ in range(r.rounds):
                v = (v * np.uint64(A) + np.uint64(C)) & np.uint64(MASK)
            out[i] = v

    def slot():
        stream = nh.simulator.Stream()
        answer = np.zeros(N, np.uint64)

        def launch(seed, rounds):
            stream.sleep(rounds * 0.001)  # device time: 20 ms a unit
            fields = dict(out=answer, n=N, seed=seed, rounds=rounds)
            stream.launch(respond, user_data=nh.record(request, **fields))

        return stream, launch, answer

    slots = [slot() for _ in range(SLOTS)]
    stream, launch, _ = slots[0]
    launch(0, 1)  # compile the kernel now, not while the loop serves
    stream.sync()
    return slots, 20, lambda: [stream.close() for stream, _, _ in slots]


class Server:
    def __init__(self, slots, rounds_per_unit):
        self.rounds_per_unit = rounds_per_unit
        self.free = asyncio.Queue()  # slots not in use
        for s in slots:
            self.free.put_nowait(s)
        self.in_flight = 0  # requests whose stream is working
        self.busy_turns = 0  # loop turns taken while some were
        self.answered = []  # seeds, in the order their streams got there
        self.books = []  # (seed, thread) from the non-blocking callbacks

    def note_done(self, seed):
        # A non-blocking callback: on the main thread or numba_hostfn's helper thread,
        # soon after the stream got here. A list.append is safe from either.
        self.books.append((seed, threading.current_thread().name))

    async def handle(self, reader, writer):
        seed, units = map(int, (await reader.readline()).split())
        slot = await self.free.get()
        stream, launch, answer = slot
        try:
            launch(seed, units * self.rounds_per_unit)
            nh.host_launch(stream, functools.partial(self.note_done, seed), blocking=False)
            self.in_flight += 1
            await nh.async_done(stream)  # this handler sleeps; the loop goes on
            self.in_flight -= 1
            self.answered.append(seed)
            reply = int(answer.sum())  # read before the slot is reused
        finally:
            self.free.put_nowait(slot)
        writer.write(f"{reply}\n".encode())
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def ticker(self):
        while True:
            if self.in_flight:
                self.busy_turns += 1
            await asyncio.sleep(0)  # one turn of the loop


async def ask(port, seed, units, rounds_per_unit):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{seed} {units}\n".encode())
    await writer.drain()
    reply = int(await reader.readline())
    writer.close()
    await writer.wait_closed()
    return reply == expected(seed, units * rounds_per_unit)


async def serve(server):
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    ticker = asyncio.ensure_future(server.ticker())
    try:
        async with listening:
            return await asyncio.gather(
                *(ask(port, seed, units, server.rounds_per_unit) for seed, units in REQUESTS)
            )
    finally:
        ticker.cancel()


def main() -> int:
    setup = simulator_setup if nh.backend_name() == "simulator" else gpu_setup
    slots, rounds_per_unit, cleanup = setup()
    try:
        server = Server(slots, rounds_per_unit)
        start = time.perf_counter()
        correct = asyncio.run(serve(server))
        seconds = time.perf_counter() - start
        nh.drain()  # runs any bookkeeping callback not run yet, here
        seeds = sorted(seed for seed, _ in REQUESTS)
        booked = sorted(seed for seed, _ in server.books)
        ok = all(correct) and sorted(server.answered) == seeds and booked == seeds
        ok = ok and server.busy_turns > 0
        threads = sorted({thread for _, thread in server.books})
        print(
            f"{len(REQUESTS)} requests on {SLOTS} streams in {seconds:.3f} s, answered in "
            f"the order {server.answered}; answers right: {sum(correct)}/{len(correct)}; "
            f"the loop turned {server.busy_turns} times while kernels ran; bookkeeping "
            f"ran on {threads} -> {'OK' if ok else 'WRONG'}"
        )
        return 0 if ok else 1
    finally:
        cleanup()


if __name__ == "__main__":
    sys.exit(main())
