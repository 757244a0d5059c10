"""Testing hooks.  Not for production use.

``fail_child_at(step, errno)`` makes every child spawned inside the block fail
at the named step (see ``sbxlimit.STEPS``) with that errno, proving that each
step's error reaches Python with its step and errno.
"""

from ._spawn import fail_child_at

__all__ = ["fail_child_at"]
