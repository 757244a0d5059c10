"""Type stub for the C extension sbxlimit._core (csrc/_coremodule.c)."""

import sys
from collections.abc import Callable, Sequence
from typing import Any

from _typeshed import StrOrBytesPath

STEPS: tuple[str, ...]
HAS_VFORK: int
HAS_PROCTREE: int
TREE_CACHE_SIZE: int
HAS_SECCOMP: int
PROBE_PIDFD: int
PROBE_CLOSE_RANGE: int
PROBE_NO_NEW_PRIVS: int
PROBE_SECCOMP: int
PROBE_UNSHARE: int
PROBE_CLONE3_CGROUP: int
PROBE_HANG: int
PROBE_NAMESPACES: int
PROBE_RO_VIEW: int
SECCOMP_HARDEN: int
SECCOMP_NET_DENY: int
SECCOMP_NET_PROXY: int
SECCOMP_FAMILIES: int
SECCOMP_SIGNALS: int
SECCOMP_VERSION: int
CAPS_DROP: int
CAPS_BOUNDING: int
VIEW_RW: int
VIEW_RW_DEV: int
VIEW_RO: int
VIEW_RO_MOUNT: int
VIEW_HIDE_DIR: int
VIEW_HIDE: int
VIEW_TMPFS: int
VIEW_PIN: int
WATCH_SELF: int
WATCH_REMOTE: int
VIEW_MAX_RW: int
HOW_VM: int
HOW_CLONE3: int
HOW_INTO_CGROUP: int
MNT_NS_ASK: int
FS_MKDIR: int
FS_RMDIR: int
FS_WRITE: int
FS_WRITE_OPTIONAL: int
FS_READ: int
FS_STAT: int
FS_OPEN_WRITE: int
FS_OPEN_READ: int
FS_V1_EVENT: int
FS_CLOSE: int
FS_RM_WORKSPACE: int
FS_PREAD: int
FS_READ_MAX: int

def spawn(
    exec_paths: Sequence[StrOrBytesPath] | None,
    argv: Sequence[StrOrBytesPath],
    envp: Sequence[bytes] | None,
    cwd: StrOrBytesPath | None,
    stdin: int,
    stdout: int,
    stderr: int,
    close_fds: bool,
    keep_fds: Sequence[int],
    close_after: Sequence[int],
    restore_signals: bool,
    new_session: bool,
    pgid: int,
    groups: Sequence[int] | None,
    gid: int,
    uid: int,
    umask: int,
    rlimits: Sequence[tuple[int, int, int]],
    pdeathsig: int,
    no_new_privs: bool,
    drop_caps: int,
    caps_keep: int,
    seccomp: int,
    seccomp_guard: int,
    landlock_fd: int,
    ns: tuple[
        int,
        bytes,
        bytes,
        bool,
        bytes,
        bytes,
        bytes,
        int,
        int,
        Sequence[tuple[int, bytes, bytes]],
        bool,
        bool,
        int,
        bytes,
        int,
        int,
        int,
        int,
        int,
    ]
    | None,
    cgroup_dirfd: int,
    cgroup_procs: Sequence[int],
    preexec_fn: Callable[[], Any] | None,
    fail_step: int,
    fail_errno: int,
    /,
) -> tuple[int, tuple[str, int, int, int] | None, int, int]: ...
def seccomp_program(what: int, caller: int, caller_pgid: int, guard: int = 0, /) -> bytes: ...
def tree_sample(
    pid: int, skip_root: bool = False, cache: bytearray | None = None, /
) -> tuple[int, int, int, float, float, bool]: ...
def tree_sample_many(
    trees: list[tuple[int, bool, bytearray]], /
) -> list[tuple[int, int, int, float, float, bool] | int | None]: ...
def ns_make(kind: int, /) -> int: ...
def dev_template() -> int: ...
def view_ns(
    view: Sequence[tuple[int, bytes, bytes]], view_ro_root: bool, dev_fd: int, /
) -> tuple[int, tuple[int, ...], tuple[int, int, int], tuple[int, int, int]]: ...
def views_stale(
    mounts_fd: int, watch_fd: int, root: tuple[int, int, int], mount_ns: tuple[int, int, int], /
) -> bool: ...
def caller_place() -> tuple[int, ...] | None: ...
def tree_signal(pid: int, sig: int, pgid: int, /) -> int: ...
def probe(kind: int, arg: int = 0, timeout_ms: int = 1000, /) -> int: ...
def landlock_abi() -> int: ...
def cgroup_fs_kind(path: StrOrBytesPath, /) -> int: ...
def fs_batch(
    steps: Sequence[
        tuple[int, StrOrBytesPath, bytes | None]
        | tuple[int, StrOrBytesPath, bytes | None, int]
        | tuple[int, StrOrBytesPath, bytes | None, int, int]
    ],
    stop_at_error: bool,
    anchors: Sequence[tuple[StrOrBytesPath, int, StrOrBytesPath]] = (),
    /,
) -> list[int | bytes | tuple[int, int] | tuple[int]]: ...
def watch_open() -> int: ...
def watch_add(fd: int, paths: Sequence[StrOrBytesPath], what: int, /) -> list[int]: ...
def watch_changed(fd: int, skip: Sequence[StrOrBytesPath], /) -> list[int]: ...
def seatbelt_profile(
    *,
    workspace: StrOrBytesPath | None = None,
    workspaces_root: StrOrBytesPath | None = None,
    writable_roots: Sequence[StrOrBytesPath] = (),
    deny_read: Sequence[StrOrBytesPath] = (),
    deny_write: Sequence[StrOrBytesPath] = (),
    protect_dotfiles: bool = False,
    protected_paths: Sequence[StrOrBytesPath] = (),
    ttys: Sequence[StrOrBytesPath] = (),
    unix_sockets: Sequence[StrOrBytesPath] = (),
    network: int = 0,
    proxy_ports: Sequence[int] = (),
) -> str: ...
def seatbelt_canonical(path: StrOrBytesPath, /) -> str: ...

if sys.platform == "darwin":
    # Put this process under the profile (the forked-callable path).
    def seatbelt_apply(profile: str, /) -> None: ...

def landlock_ruleset(
    handled: int,
    rules: Sequence[tuple[StrOrBytesPath, int]],
    handled_net: int = 0,
    net_access: int = 0,
    ports: Sequence[int] = (),
    scoped: int = 0,
    /,
) -> tuple[int, int]: ...

if sys.platform == "win32":
    # csrc/windows/_corewin.c: the Windows build has these and none of the above.
    HAS_JOB: int
    JOB_HOW_JOB_LIST: int
    JOB_HOW_ASSIGN: int
    JOB_MSG_END_OF_JOB_TIME: int
    JOB_MSG_ACTIVE_PROCESS_LIMIT: int
    JOB_MSG_ACTIVE_PROCESS_ZERO: int
    JOB_MSG_NEW_PROCESS: int
    JOB_MSG_EXIT_PROCESS: int
    JOB_MSG_ABNORMAL_EXIT_PROCESS: int
    JOB_MSG_JOB_MEMORY_LIMIT: int

    def job_create(
        memory: int, pids: int, cpu_time_100ns: int, cpu_millicores: int, /
    ) -> tuple[object, int, tuple[str, int] | None]: ...
    def job_close(job: object, /) -> None: ...
    def job_spawn(
        job: object,
        application: str | None,
        command_line: str,
        cwd: str | None,
        environment: str | None,
        stdin: int | None,
        stdout: int | None,
        stderr: int | None,
        handles: Sequence[int],
        creation_flags: int,
        startup_flags: int = 0,
        show_window: int = 0,
        no_job_list: bool = False,
        /,
    ) -> tuple[int, int, int, int, int]: ...
    def job_next_event(job: object, timeout_ms: int, /) -> tuple[int, int] | None: ...
    def job_usage(job: object, /) -> tuple[int, int, int, int, int, int, int, int, int, int]: ...
    def job_cpu_time_reached(job: object, /) -> bool: ...
    def job_kill(job: object, exit_code: int, /) -> None: ...
    def job_msg_name(msg: int, /) -> str | None: ...
    def job_msg_reason(msg: int, /) -> str | None: ...
    def job_cpu_rate(millicores: int, ncpu: int, /) -> int: ...
