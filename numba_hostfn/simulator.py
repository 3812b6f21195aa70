"""The stream simulator: host functions without a GPU (select with NUMBA_HOSTFN_SIMULATOR=1).

See docs/simulator.md for what it models and what it does not.
"""

from ._errors import SimulatorUnsupportedError
from ._simulator import Graph, GraphBuilder, Stream, new_context

__all__ = ["Graph", "GraphBuilder", "SimulatorUnsupportedError", "Stream", "new_context"]
