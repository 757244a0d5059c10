"""Where the calling thread resolves paths: on Linux its "/" (device, inode
and mount id, ``_core.caller_place``: a mount namespace of its own or a
chroot gives "/" another mount id or inode).

A path resolved in one place may lead elsewhere in another: a thread that
unshared its mount namespace and mounted over a directory, a caller that
chrooted.  So the caches of resolved paths (the protected paths' search,
the views, the Landlock rules, the workspaces' directories) are kept per
place.  A spawn asks once (one statx) and passes the answer on; a function
given none asks itself."""

from __future__ import annotations

from . import _core

__all__ = ["Place", "here"]

Place = tuple[int, ...] | None  # None: this platform or kernel cannot say

_caller_place = getattr(_core, "caller_place", None)


def here() -> Place:
    return _caller_place() if _caller_place is not None else None
