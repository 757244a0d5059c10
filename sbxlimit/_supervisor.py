"""Protections the supervising process itself holds or states: the
environment it passes (``env``), the session it starts the program in
(``terminal``), the output it pumps (``output``), and what a platform
cannot hold, said once in ``enforced`` (Unix sockets by path on Linux,
the parent-death signal and PID namespaces on macOS, file rules where no
mechanism exists)."""

from __future__ import annotations

from ._plan import Plan, Request

__all__ = [
    "plan_env",
    "plan_no_files",
    "plan_no_parent_death",
    "plan_no_pid_namespace",
    "plan_output",
    "plan_terminal",
    "plan_unix_sockets",
]


def plan_env(p: Plan, r: Request) -> None:
    """What Popen passes (Policy.filter_env)."""
    policy = r.policy
    if policy is None:
        return
    env = "LD_*, DYLD_* dropped" if policy.env == "sanitize" else "allow-list"
    if policy.drop_secrets:
        env += "; names with KEY, SECRET, TOKEN or PASSWORD dropped"
    p.hold("env", "supervisor:env", env)


def plan_output(p: Plan, r: Request) -> None:
    """stdout and stderr through a pump each (``_pump`` on POSIX, the job's
    ``OutputPump`` threads on Windows), capped at ``Limits.output``."""
    if r.limits is None or r.limits.output is None:
        return
    p.output = r.limits.output
    p.truncate_output = r.limits.truncate_output
    truncated = ("truncated, not killed",) if r.limits.truncate_output else ()
    p.hold("output", "supervisor:output", *truncated)


def plan_terminal(p: Plan, r: Request) -> None:
    """A session of its own (setsid): no controlling terminal to type into,
    unless Policy(terminal=True) shares the caller's; the note says what
    refuses TIOCSTI besides."""
    policy = r.policy
    if policy is None:
        return
    filt: tuple[str, ...] = ()
    if p.seccomp:
        filt = ("TIOCSTI and TIOCLINUX refused by seccomp",)
    elif p.seatbelt:
        filt = (
            "TIOCSTI refused by the Seatbelt profile; no terminal of the user's but those on "
            "its stdio",
        )
    if policy.terminal:
        p.hold("terminal", "shared: Policy(terminal=True)", *filt)
        return
    p.new_session = True
    p.hold("terminal", "session:setsid (no controlling terminal)", *filt)


def plan_unix_sockets(p: Plan, r: Request) -> None:
    """Linux: said, not refused by strict (no Linux sandbox could run under
    strict=True otherwise): Landlock ABI 9 (Linux 7.1) is the first rule for
    a connect by path."""
    if r.policy is None:
        return
    p.say(
        "unix_sockets",
        "Linux has no rule for connecting to a Unix socket by its path before Landlock ABI 9 "
        "(Linux 7.1): a socket the program's user may open (the Docker socket, ssh-agent) is "
        "reachable; deny_read removes one from the sandbox's view",
    )


def plan_no_pid_namespace(p: Plan, r: Request) -> None:
    if r.policy is not None and r.policy.isolate_pids:
        p.downgrade("isolate_pids", "PID namespaces exist only on Linux")


def plan_no_parent_death(p: Plan, r: Request) -> None:
    """macOS: said, not refused by strict: nobody asked for it, and no macOS
    sandbox could run under strict=True otherwise."""
    del r
    p.say(
        "die_with_parent",
        "macOS has no parent-death signal: a sandbox outlives a caller that is killed; end it "
        "with kill_tree(), a with block or wall_time",
    )


def plan_no_files(p: Plan, r: Request) -> None:
    """A platform with no file or network mechanism sbxlimit knows."""
    policy = r.policy
    if policy is None:
        return
    why = "no mount namespace and no Landlock here (Linux 5.13+, see doctor)"
    p.downgrade("files", why)
    if policy.protect_dotfiles:
        p.downgrade("protect_dotfiles", why)
    if policy.network != "allow":
        p.downgrade("network", "no network mechanism on this platform")
