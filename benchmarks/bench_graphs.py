"""Section graphs: the replay cost per host node of a captured graph.

K host nodes are captured into one graph on a stream (cuda.core's GraphBuilder
shape, the simulator's too: ``stream.create_graph_builder().begin_building()``,
``host_launch(builder, fn)`` K times, ``end_building().complete()``); the graph is
replayed once untimed (its upload and first-run costs), then R times, timed from
the first ``graph.launch(stream)`` to ``stream.sync()``: per node = elapsed / (R*K).
Each sample captures a fresh graph.  Nodes: an empty compiled host function and a
no-op Python callable through host_launch; on a GPU also cuda.core's own
``GraphBuilder.callback`` of the same Python callable.  Ratios are to the compiled
node.
"""

from __future__ import annotations

import time

from _bench import ROWS, Row, Target, compiled_functions, find, noop, ratio, record, target

GROUP = "graph replay"
COMPILED = "captured HostFunction node"
PYTHON = "captured Python callable node"
CUDA_CORE = "captured cuda.core callback node (Python)"
PLOTS = [(GROUP, "graphs.png")]


def run(nh, device, nodes: int, replays: int, repeats: int) -> None:
    empty, _ = compiled_functions(nh)
    stream = device.create_stream()

    def per_node(add_node) -> float:
        builder = stream.create_graph_builder().begin_building()
        graph = None
        try:
            for _ in range(nodes):
                add_node(builder)
            graph = builder.end_building().complete()
            graph.launch(stream)  # untimed: the upload and the first replay
            stream.sync()
            start = time.perf_counter()
            for _ in range(replays):
                graph.launch(stream)
            stream.sync()
            elapsed = time.perf_counter() - start
        finally:  # a failing row must not leave the stream capturing or replaying
            if graph is None and builder.is_building:
                builder.end_building()
            stream.sync()
            if graph is not None:
                graph.close()
            builder.close()
            nh.drain()
        return elapsed / (replays * nodes) * 1e6

    record(
        GROUP, COMPILED, "µs/node", lambda: per_node(lambda b: nh.host_launch(b, empty)), repeats
    )
    record(GROUP, PYTHON, "µs/node", lambda: per_node(lambda b: nh.host_launch(b, noop)), repeats)
    if device.simulator:
        ROWS.append(Row(GROUP, CUDA_CORE, "µs/node", note="needs a GPU"))
    else:
        record(GROUP, CUDA_CORE, "µs/node", lambda: per_node(lambda b: b.callback(noop)), repeats)
    device.close_stream(stream)


def baseline(group: str) -> Row | None:
    return find(GROUP, COMPILED) if group == GROUP else None


def targets() -> list[Target]:
    # Informational: no limit, the ratio is shown (met: n/a).
    return [
        target(
            "captured Python node / captured compiled node",
            ratio(find(GROUP, PYTHON), find(GROUP, COMPILED)),
            None,
        )
    ]
