"""The ``sbxlimit`` command line (also ``python -m sbxlimit``).

Exit status of ``sbxlimit run``:
  the program's own status when it exits;
  128 + N when signal N ended it (130 for Ctrl-C);
  124 when a limit ended it (the reason is on stderr, and in --json);
  125 when the sandbox cannot be set up (strict policy, setup step failed);
  126 when the program cannot be executed, 127 when it is not found;
  2   for bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from ._doctor import _isatty_color, doctor
from ._errors import ConfigError, SandboxSetupError, UnsupportedError
from ._gc import collect
from ._limits import Limits
from ._monitor import signal_tree
from ._policy import Policy
from ._popen import Popen
from ._settings import build, flag_value, manifest_limits

__all__ = ["main", "main_entry"]

EXIT_LIMIT, EXIT_SETUP, EXIT_NOEXEC, EXIT_NOTFOUND, EXIT_USAGE = 124, 125, 126, 127, 2

_RUN_EXAMPLES = """\
examples:
  sbxlimit run --memory 256Mi --timeout 30s -- python3 tool.py
  sbxlimit run --cpu-time 10s --output 1Mi --json -- ./untrusted --flag
  sbxlimit run --manifest tool.json --pids 64 -- node server.js

exit status: the program's own; 128+N if signal N ended it; 124 if a limit
ended it (reason on stderr); 125 sandbox setup failed; 126 cannot execute;
127 not found; 2 bad arguments.
"""

# (flag, Limits field, help)
_LIMIT_FLAGS = (
    ("--memory", "memory", "bytes the sandbox may use, e.g. 256Mi"),
    ("--cpu-time", "cpu_time", "CPU seconds, e.g. 10s"),
    ("--cpu", "cpu", "CPU rate in cores or millicores, e.g. 500m"),
    ("--pids", "pids", "processes + threads"),
    ("--open-files", "open_files", "file descriptors per process"),
    ("--file-size", "file_size", "largest file written, e.g. 10Mi"),
    ("--disk", "disk", "bytes in the workspace, e.g. 1Gi"),
    ("--timeout", "wall_time", "wall-clock time, e.g. 30s"),
    ("--output", "output", "bytes of stdout and of stderr passed on, e.g. 1Mi"),
    ("--kill-grace", "kill_grace", "seconds between SIGTERM and SIGKILL (default 5)"),
)
# (flag, Policy field): repeatable paths
_PATH_FLAGS = (
    ("--writable", "writable_roots"),
    ("--deny-read", "deny_read"),
    ("--deny-write", "deny_write"),
    ("--unix-socket", "unix_sockets"),
)
_UNIX_SOCKET_HELP = (
    "a Unix socket the program may connect to (macOS refuses the others; repeatable)"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One clear line and exit 2, argparse style, without the usage dump.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="sbxlimit",
        description="Run programs under enforced resource limits and a sandbox.",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    d = sub.add_parser("doctor", help="what this machine can enforce (exit 1 if not all)")
    d.add_argument("--json", action="store_true", help="print the report as JSON")

    r = sub.add_parser(
        "run",
        help="run one command under limits",
        usage="sbxlimit run [options] -- CMD [ARGS...]",
        epilog=_RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for flag, field, text in _LIMIT_FLAGS:
        r.add_argument(flag, dest=field, metavar="VALUE", help=text)
    r.add_argument(
        "--truncate-output", action="store_true", help="past --output, discard instead of kill"
    )
    r.add_argument(
        "--tolerate",
        metavar="LIMITS",
        help="comma-separated limits (memory, pids, disk) whose refusals do not end the "
        "sandbox: the program sees EAGAIN/ENOSPC and may go on",
    )
    r.add_argument("--deny-network", action="store_true", help="no network access")
    _add_path_flags(r, unix_socket_help=_UNIX_SOCKET_HELP)
    r.add_argument(
        "--terminal",
        action="store_true",
        help="with a policy, keep this terminal for the program (its session, job control, "
        "Ctrl-C); by default a sandbox gets a session of its own",
    )
    r.add_argument(
        "--strict",
        action="store_true",
        help="refuse to run if anything asked for cannot be enforced",
    )
    r.add_argument(
        "--manifest", metavar="FILE", help="JSON manifest with resources and execution_limits"
    )
    r.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="print usage, termination and enforced as JSON: to FILE, else as stdout's last line",
    )
    r.add_argument("cmd", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    sb = sub.add_parser(
        "seatbelt-profile",
        help="print the macOS Seatbelt profile a policy becomes (works on any OS)",
    )
    net = sb.add_mutually_exclusive_group()
    net.add_argument("--deny-network", action="store_true", help="no network access")
    net.add_argument(
        "--proxy-port",
        action="append",
        type=int,
        default=[],
        metavar="PORT",
        help="only loopback to PORT (repeatable)",
    )
    sb.add_argument("--workspace", metavar="PATH", help="the sandbox's writable workspace")
    _add_path_flags(sb, unix_socket_help=None)
    sb.add_argument(
        "--no-protect-dotfiles", action="store_true", help="allow writes to shell/git dotfiles"
    )

    g = sub.add_parser("gc", help="remove leftovers of crashed supervisors (cgroups, workspaces)")
    g.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    return p


def _add_path_flags(p: argparse.ArgumentParser, *, unix_socket_help: str | None) -> None:
    for flag, field in _PATH_FLAGS:
        text = unix_socket_help if flag == "--unix-socket" else None
        p.add_argument(flag, dest=field, action="append", default=[], metavar="PATH", help=text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "gc":
        return _gc(args)
    if args.command == "seatbelt-profile":
        return _seatbelt_profile(args)
    return _run(parser, args)


def _seatbelt_profile(args: argparse.Namespace) -> int:
    try:
        policy = Policy(
            **{field: getattr(args, field) for _flag, field in _PATH_FLAGS},
            protect_dotfiles=not args.no_protect_dotfiles,
            network="deny" if args.deny_network else "proxy" if args.proxy_port else "allow",
            proxy_ports=args.proxy_port,
        )
        print(policy.seatbelt_profile(workspace=args.workspace), end="")
    except ValueError as e:
        print(f"sbxlimit: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _doctor(args: argparse.Namespace) -> int:
    report = doctor()
    if args.json:
        print(report.to_json())
    else:
        print(report.render(color=_isatty_color(sys.stdout)))
    return 0 if report.ok else 1


def _gc(args: argparse.Namespace) -> int:
    removed = collect(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for item in removed:
        print(f"{verb} {item}")
    if not removed:
        print("nothing to remove")
    return 0


def _settings(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[Limits | None, Policy | None]:
    """Limits and Policy from --manifest, then the limit flags over it, and
    the policy flags; a bad value is a ConfigError naming its flag (or the
    manifest's JSON path)."""
    values: dict[str, Any] = {}
    if args.manifest:
        try:
            with open(args.manifest) as f:
                manifest = json.load(f)
        except (OSError, ValueError) as e:
            parser.error(f"--manifest {args.manifest}: {e}")
        values = manifest_limits(manifest)
    for flag, field, _help in _LIMIT_FLAGS:
        v = getattr(args, field)
        if v is not None:
            values[field] = flag_value(flag, field, v)
    if args.truncate_output:
        values["truncate_output"] = True
    if args.tolerate:
        values["tolerate"] = flag_value("--tolerate", "tolerate", args.tolerate)
    if args.deny_network:
        values["network"] = "deny"
    for _flag, field in _PATH_FLAGS:
        if getattr(args, field):
            values[field] = [os.path.abspath(p) for p in getattr(args, field)]
    if args.terminal:
        values["terminal"] = True
    if args.strict:
        values["strict"] = True
    return build(values)


@contextlib.contextmanager
def _foreground(pgid: int) -> Iterator[None]:
    """Hand the terminal to the sandbox's process group while it runs, as a
    shell does, so that it can read the terminal and gets Ctrl-C itself.
    Only a group of our session can have it: a policy sandbox has a session
    of its own (--terminal keeps ours), and we forward Ctrl-C to it."""
    try:
        tty = os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp() and os.getsid(pgid) == os.getsid(0)
    except OSError:
        tty = False
    if not tty:
        yield
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(0, pgid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)  # in case it read before the handoff
        yield
    finally:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(0, os.getpgrp())
        signal.signal(signal.SIGTTOU, old)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        parser.error("missing command: sbxlimit run [options] -- CMD [ARGS...]")
    try:
        limits, policy = _settings(parser, args)
    except ConfigError as e:
        parser.error(str(e))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        try:
            proc = Popen(cmd, limits=limits or Limits(), policy=policy)
        except (UnsupportedError, SandboxSetupError) as e:  # before OSError: both can be
            print(f"sbxlimit: {e}", file=sys.stderr)
            return EXIT_SETUP
        except OSError as e:  # from exec: the program itself
            print(f"sbxlimit: {cmd[0]}: {e.strerror}", file=sys.stderr)
            return EXIT_NOTFOUND if isinstance(e, FileNotFoundError) else EXIT_NOEXEC
    for w in caught:
        text = str(w.message).removeprefix("sbxlimit: ")
        print(f"sbxlimit: warning: {text}", file=sys.stderr)

    grace = limits.kill_grace if limits else 5.0
    stopping = threading.Event()

    def forward(signum: int, _frame: Any) -> None:
        # End the whole tree; the main thread keeps waiting for the leader.
        if not stopping.is_set():
            stopping.set()
            signal_tree(proc.pid, signal.SIGTERM, os.getpgid(proc.pid) if _alive(proc) else 0)
            t = threading.Timer(grace, lambda: signal_tree(proc.pid, signal.SIGKILL, 0))
            t.daemon = True
            t.start()

    handlers = {
        s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        with _foreground(proc.pid):
            proc.wait()
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)

    t = proc.termination
    assert t is not None
    if t.is_limit:
        print(f"sbxlimit: {t.message}", file=sys.stderr)
        status = EXIT_LIMIT
    elif t.signal is not None:
        status = 128 + t.signal
    else:
        status = t.returncode or 0
    if args.json is not None:
        doc = {
            "command": os.path.basename(cmd[0]),
            "exit_status": status,
            "termination": t.to_dict(),
            "usage": proc.usage().to_dict(),
            "enforced": proc.enforced,
        }
        text = json.dumps(doc)
        if args.json == "-":
            try:
                sys.stdout.flush()
                print(text, flush=True)
            except BrokenPipeError:
                # Whoever read stdout is gone (`... | head -1`): the status
                # still says how the program ended.  Point stdout at
                # /dev/null so that the interpreter's last flush is quiet.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return status


def _alive(proc: subprocess.Popen[Any]) -> bool:
    return proc.poll() is None


def main_entry() -> NoReturn:
    """Console-script entry point."""
    sys.exit(main())
