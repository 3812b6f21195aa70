"""Helpers for compiled host-function bodies."""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic

from ._compat import cgutils

__all__ = ["as_voidptr"]


@intrinsic
def as_voidptr(typingctx, address):
    """Turn an integer address (e.g. a ``uint64`` field of the user data) into a ``void*``.

    For use inside ``@host_callback`` bodies, to follow pointers stored in the
    user data: ``carray(as_voidptr(d.dst), (n,), np.float64)``.  Calling it from
    Python is not supported.
    """
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen
