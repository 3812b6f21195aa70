"""Helpers for compiled host-function bodies (importing this module imports numba)."""

from __future__ import annotations

from ._compat import numba_hooks

__all__ = ["as_voidptr"]

_numba = numba_hooks()


@_numba.intrinsic
def as_voidptr(typingctx, address):
    """Turn an integer address (e.g. a ``uint64`` field of the user data) into a ``void*``.

    For use inside ``@host_callback`` bodies, to follow pointers stored in the
    user data: ``carray(as_voidptr(d.dst), (n,), np.float64)``.  Calling it from
    Python is not supported.
    """
    types = _numba.types
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], _numba.cgutils.voidptr_t)

    return types.voidptr(address), codegen
