"""The slots of :mod:`gper.ops.state` as Triton constants, for ``@triton.jit`` kernels.

A kernel may read a module-level name only when it holds a ``tl.constexpr`` instance
(``NAME = tl.constexpr(value)``; Triton 3.9 refuses the annotated form ``NAME: tl.constexpr =
value``), and then folds it like a literal: ``counters + C_SIZE`` compiles to what
``counters + 2`` did. The values come from :mod:`gper.ops.state`, the one place they are defined.
"""

from __future__ import annotations

from gper._triton import tl
from gper.ops import state

C_RNG = tl.constexpr(state.C_RNG)
C_CURSOR = tl.constexpr(state.C_CURSOR)
C_SIZE = tl.constexpr(state.C_SIZE)
C_INVALID = tl.constexpr(state.C_INVALID)
C_NONFINITE = tl.constexpr(state.C_NONFINITE)
C_STALE = tl.constexpr(state.C_STALE)
C_TICKET = tl.constexpr(state.C_TICKET)
C_TICKET_TOP = tl.constexpr(state.C_TICKET_TOP)
S_MAXP = tl.constexpr(state.S_MAXP)
MODE_STRATIFIED = tl.constexpr(state.MODE_STRATIFIED)
MODE_UNIFORM = tl.constexpr(state.MODE_UNIFORM)
