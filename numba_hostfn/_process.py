"""The process's backend: chosen once, from NUMBA_HOSTFN_SIMULATOR at first use; and fork.

The layers above register callbacks here (``on_backend``) instead of being
imported by this module: ``_launch`` points the native host_launch at the backend.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ._backend import Backend, env_switch
from ._cuda import CudaBackend, cuda_driver_usable
from ._simbackend import SimulatorBackend

__all__ = [
    "SIMULATOR_ENV",
    "forked",
    "get_backend",
    "on_backend",
    "simulator_requested",
    "simulator_unless_driver",
    "use_simulator",
]

#: The environment variable that selects the simulator backend (this module's switch).
SIMULATOR_ENV = "NUMBA_HOSTFN_SIMULATOR"

#: How to get the simulator instead, as a BackendUnavailableError says it: the
#: backend is chosen at first use, so either way works until then, also after
#: this error (which chose none).
_USE_SIMULATOR = (
    "to run on the simulator instead, call numba_hostfn.simulate_without_gpu() or set "
    f"{SIMULATOR_ENV}=1 (in the environment or os.environ) and try again: the backend "
    "is chosen at first use, not at import, and this error chose none"
)
#: Why the simulator runs when the program asked for it, as its errors say it.
_SIMULATOR_REQUESTED = f"{SIMULATOR_ENV} is set: unset it to use real CUDA streams"

_lock = threading.Lock()
_backend: Backend | None = None
#: Called with the backend once it is made (``_launch`` points the native
#: host_launch at it): the layers above register here instead of being imported.
_on_backend: list = []


def on_backend(callback: Any) -> None:
    """Call ``callback(backend)`` when the process's backend is made."""
    _on_backend.append(callback)


def simulator_requested() -> bool:
    """True if ``NUMBA_HOSTFN_SIMULATOR`` asks for the simulator, False if it is unset
    or says no; ``ValueError`` if it says neither (``env_switch``)."""
    return env_switch(SIMULATOR_ENV, False, "run on the simulator")


def get_backend() -> Backend:
    """Return the process's backend, choosing it on first use."""
    global _backend
    backend = _backend
    if _forked:
        raise RuntimeError(
            "numba_hostfn was used in this process's parent before fork(); a forked "
            "child cannot use it (CUDA does not survive fork, and the parent's driver "
            "and pool threads do not exist here). Start worker processes with the "
            "'spawn' or 'forkserver' method: multiprocessing.set_start_method('spawn')"
        )
    if backend is not None:
        return backend
    with _lock:
        if _backend is None:
            if simulator_requested():
                backend: Backend = SimulatorBackend(
                    _simulator_chosen_because, requested=_SIMULATOR_REQUESTED
                )
            else:
                backend = CudaBackend(use_simulator=_USE_SIMULATOR)
            for callback in _on_backend:
                callback(backend)
            _backend = backend
        return _backend


_forked = False


def forked() -> bool:
    """True in a child forked from a process that had used numba_hostfn."""
    return _forked


def _after_fork_in_child() -> None:
    # The child has the parent's memory but none of its threads: no driver
    # thread or pool thread will ever run a copied launch.  Refuse every later
    # use (LIFETIME.md, Scope); the child's exit waits for none of them (the native
    # close reads the fork flag: invariant 22).
    # A thread of the parent may have been making the backend (holding _lock): it
    # is gone here, and the lock with it; the parent used the package.
    global _forked, _lock
    making = _lock.locked()
    _lock = threading.Lock()
    if _backend is not None or making:
        _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


#: Why this process chose the simulator itself ("" if it did not): error messages say it.
_simulator_chosen_because = ""


def use_simulator(because: str = "") -> None:
    """Select the simulator for this process (before first use), as the env variable does.

    ``because`` says why, when it is not the caller's request (no driver found).
    """
    global _simulator_chosen_because
    if _backend is not None and _backend.name != "simulator":
        raise RuntimeError("numba_hostfn already uses the CUDA backend in this process")
    _simulator_chosen_because = because
    os.environ[SIMULATOR_ENV] = "1"


def simulator_unless_driver() -> bool:
    """For entry points that run anywhere (demo, tests, benchmarks): use the simulator
    when it is requested or no CUDA driver is usable.  Returns True if it is in use.

    The library itself never falls back silently: without this call, no driver and
    no simulator selected is a BackendUnavailableError.  Once the backend is chosen,
    the answer is whether it is the simulator, whatever the variable says now.
    """
    backend = _backend
    if backend is not None and backend.name == "simulator":
        return True
    if backend is None and simulator_requested():
        return True
    if cuda_driver_usable():
        return False
    use_simulator(because="no usable CUDA driver was found")
    return True
