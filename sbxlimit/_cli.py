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
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, NoReturn

from . import __version__
from ._config import load_config
from ._doctor import _isatty_color, doctor
from ._errors import ConfigError, SandboxSetupError, UnsupportedError
from ._gc import collect
from ._limits import Limits
from ._monitor import signal_tree
from ._policy import Policy
from ._popen import Popen
from ._settings import (
    LIMIT_FIELDS,
    SettingsError,
    build,
    field_help,
    field_value,
    from_text,
    manifest_defaulted,
    manifest_limits,
)
from ._units import format_bytes, format_seconds

__all__ = ["main", "main_entry"]

EXIT_LIMIT, EXIT_SETUP, EXIT_NOEXEC, EXIT_NOTFOUND, EXIT_USAGE = 124, 125, 126, 127, 2
# The --json document's format (sbxlimit/schemas/run-result.schema.json):
# raised when a field changes meaning or goes away, not when one is added.
JSON_VERSION = 1

_RUN_EXAMPLES = """\
examples:
  sbxlimit run --memory 256Mi --wall-time 30s -- python3 tool.py
  sbxlimit run --cpu-time 10s --output 1Mi --json -- ./untrusted --flag
  sbxlimit run --deny-network --workdir . -- python3 script.py
  sbxlimit run --manifest tool.json --pids 64 --explain -- node server.js

defaults: sbxlimit.toml or pyproject.toml [tool.sbxlimit] (here or in a
parent; --config FILE, --no-config), then SBXLIMIT_<FIELD> variables
(SBXLIMIT_MEMORY=256Mi), then --manifest, then these flags.

exit status: the program's own; 128+N if signal N ended it; 124 if a limit
ended it (reason on stderr); 125 sandbox setup failed; 126 cannot execute;
127 not found; 2 bad arguments.
"""


class _Flag(NamedTuple):
    """How one Limits or Policy field is given on the command line."""

    flags: tuple[str, ...]  # the first is the name; the others are aliases
    metavar: str | None = None
    kind: str = "value"  # value | switch | list (repeatable) | paths | choice
    choices: tuple[str, ...] = ()
    help: str | None = None  # else the field's first sentence in its docstring


# Every Limits and Policy field has its flag here (tests check that none is
# missing); the help comes from the dataclasses' docstrings.
_FLAGS: dict[str, _Flag] = {
    "memory": _Flag(("--memory",), "SIZE"),
    "cpu_time": _Flag(("--cpu-time",), "DURATION"),
    "cpu": _Flag(("--cpu",), "CORES"),
    "pids": _Flag(("--pids",), "N"),
    "open_files": _Flag(("--open-files",), "N"),
    "file_size": _Flag(("--file-size",), "SIZE"),
    "disk": _Flag(("--disk",), "SIZE"),
    "wall_time": _Flag(("--wall-time",), "DURATION"),
    "output": _Flag(("--output",), "SIZE"),
    "kill_grace": _Flag(("--kill-grace",), "DURATION"),
    "address_space": _Flag(("--address-space",), "SIZE"),
    "truncate_output": _Flag(("--truncate-output",), kind="switch"),
    "tolerate": _Flag(("--tolerate",), "LIMITS", "list"),
    "workdir": _Flag(
        ("--workdir",),
        "DIR",
        help="run in DIR and let the program write there (its workspace); default: a "
        "private temporary workspace for writes and TMPDIR, the program starting here",
    ),
    "keep_workdir": _Flag(("--keep-workdir",), kind="switch"),
    "writable_roots": _Flag(("--writable",), "PATH", "paths"),
    "deny_read": _Flag(("--deny-read",), "PATH", "paths"),
    "deny_write": _Flag(("--deny-write",), "PATH", "paths"),
    "protect_dotfiles": _Flag(("--protect-dotfiles",), kind="switch"),
    "network": _Flag(("--network",), kind="choice", choices=("allow", "deny", "proxy")),
    "proxy_ports": _Flag(("--proxy-port",), "PORT", "list"),
    "allow_domains": _Flag(
        ("--allow-domain",),
        "NAME",
        "list",
        help="a name the program may reach through sbxlimit's filtering proxy, its only way "
        "out (pypi.org, *.github.com, example.com:443; repeatable, comma-separated); "
        "implies --network proxy",
    ),
    "deny_domains": _Flag(("--deny-domain",), "NAME", "list"),
    "proxy_connections": _Flag(("--proxy-connections",), "N"),
    "proxy_bytes": _Flag(("--proxy-bytes",), "SIZE"),
    "unix_sockets": _Flag(("--unix-socket",), "PATH", "paths"),
    "env": _Flag(
        ("--env",),
        "NAMES",
        "list",
        help="'sanitize' (default: LD_* and DYLD_* dropped), or names of the only "
        "variables the program gets (comma-separated, repeatable)",
    ),
    "drop_secrets": _Flag(("--drop-secrets",), kind="switch"),
    "harden": _Flag(("--harden",), kind="switch"),
    "isolate_pids": _Flag(("--isolate-pids",), kind="switch"),
    "capabilities": _Flag(("--capability",), "CAP", "list"),
    "terminal": _Flag(("--terminal",), kind="switch"),
    "strict": _Flag(
        ("--strict",),
        kind="switch",
        help="refuse to run (exit 125) if anything asked for cannot be enforced here",
    ),
}
# The path flags the seatbelt-profile command shares with run.
_PATH_FLAGS = tuple((f.flags[0], field) for field, f in _FLAGS.items() if f.kind == "paths")


class _Parser(argparse.ArgumentParser):
    # Set by main() when --json was asked for: errors become a JSON document too.
    json_to: str | None = None

    def error(self, message: str) -> NoReturn:
        # One clear line and exit 2, argparse style, without the usage dump.
        if self.json_to is not None:
            _emit_json(self.json_to, _error_doc(EXIT_USAGE, "usage", message))
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="sbxlimit",
        description="Run programs under enforced resource limits and a sandbox.",
    )
    p.add_argument("--version", action="version", version=f"sbxlimit {__version__}")
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
    docs = field_help()
    groups = {
        "limits": r.add_argument_group("limits (what the sandbox may use)"),
        "policy": r.add_argument_group("policy (what the sandbox may touch)"),
    }
    for field, f in _FLAGS.items():
        group = groups["limits" if field in LIMIT_FIELDS else "policy"]
        text = f.help or docs[field]
        if f.kind == "switch":
            group.add_argument(
                *f.flags, dest=field, action=argparse.BooleanOptionalAction, help=text
            )
        elif f.kind == "choice":
            group.add_argument(*f.flags, dest=field, choices=f.choices, help=text)
        elif f.kind in ("list", "paths"):
            group.add_argument(*f.flags, dest=field, action="append", metavar=f.metavar, help=text)
        else:
            group.add_argument(*f.flags, dest=field, metavar=f.metavar, help=text)
    policy = groups["policy"]
    policy.add_argument(
        "--deny-network", action="store_true", help="no network access (--network deny)"
    )
    policy.add_argument(
        "--cwd",
        metavar="DIR",
        help="start the program in DIR (default: here); with a "
        "policy it is read-only unless it is the --workdir or under a --writable path",
    )
    # The old name of --wall-time: it read as run(timeout=), which is the
    # caller's wait and raises; this ends the sandbox with a verdict.
    r.add_argument("--timeout", dest="timeout_alias", metavar="DURATION", help=argparse.SUPPRESS)

    c = r.add_argument_group("configuration and output")
    c.add_argument(
        "--manifest",
        metavar="FILE",
        help="JSON manifest with resources and "
        "execution_limits (sbxlimit/schemas/manifest.schema.json)",
    )
    cfg = c.add_mutually_exclusive_group()
    cfg.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file of default fields "
        "(default: the nearest sbxlimit.toml or pyproject.toml [tool.sbxlimit])",
    )
    cfg.add_argument(
        "--no-config",
        action="store_true",
        help="read no config file and no SBXLIMIT_<FIELD> variables",
    )
    c.add_argument(
        "--explain",
        action="store_true",
        help="print the effective limits and policy, where each came from and what would "
        "hold it here, then exit without running",
    )
    c.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="print one JSON object (usage, termination, enforced, effective settings; or "
        "the error): to FILE, else as stdout's last line",
    )
    c.add_argument(
        "--progress",
        action="store_true",
        help="on a terminal: a live status line (memory, CPU, tasks) while it runs, and a "
        "summary table at the end",
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
    for flag, field in _PATH_FLAGS:
        sb.add_argument(flag, dest=field, action="append", default=[], metavar="PATH")
    sb.add_argument(
        "--no-protect-dotfiles", action="store_true", help="allow writes to shell/git dotfiles"
    )

    g = sub.add_parser("gc", help="remove leftovers of crashed supervisors (cgroups, workspaces)")
    g.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    return p


def _json_target(argv: Sequence[str]) -> str | None:
    """Where `run --json` goes, read before parsing, so that a parse error
    is a JSON document too; None without --json."""
    args = list(argv)
    if "--" in args:
        args = args[: args.index("--")]
    if not args or args[0] != "run":
        return None
    for i, a in enumerate(args):
        if a.startswith("--json="):
            return a.split("=", 1)[1]
        if a == "--json":
            nxt = args[i + 1] if i + 1 < len(args) else None
            return "-" if nxt is None or nxt.startswith("-") else nxt
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    _Parser.json_to = _json_target(argv)
    try:
        args = parser.parse_args(argv)
        if args.command == "doctor":
            return _doctor(args)
        if args.command == "gc":
            return _gc(args)
        if args.command == "seatbelt-profile":
            return _seatbelt_profile(args)
        return _run(parser, args)
    finally:
        _Parser.json_to = None


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


class _Effective(NamedTuple):
    """The run's settings: values, where each came from, and what they make."""

    values: dict[str, Any]
    sources: dict[str, str]
    limits: Limits | None
    policy: Policy | None


def _settings(args: argparse.Namespace) -> _Effective:
    """Limits and Policy from the config file and SBXLIMIT_<FIELD>
    variables, then --manifest, then the flags, field by field; a bad
    value is a ConfigError naming where it came from (the flag, the
    variable, the file, the manifest's JSON path)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def put(field: str, value: Any, source: str) -> None:
        values[field], sources[field] = value, source

    if not args.no_config:
        config = load_config(args.config)
        for field, value in config.values.items():
            put(field, value, config.sources[field])
    if args.manifest:
        try:
            with open(args.manifest) as mf:
                manifest = json.load(mf)
        except (OSError, ValueError) as e:
            raise SettingsError(f"--manifest {args.manifest}", str(e)) from None
        defaulted = manifest_defaulted(manifest)
        for field, value in manifest_limits(manifest).items():
            put(field, value, "--manifest (default)" if field in defaulted else "--manifest")
    if args.timeout_alias is not None:
        if args.wall_time is not None:
            raise SettingsError("--timeout", "is the old name of --wall-time: give one")
        args.wall_time = args.timeout_alias
        warnings.warn(
            "--timeout is now --wall-time (the sandbox's wall-clock limit)",
            DeprecationWarning,
            stacklevel=1,
        )
    if args.deny_network:
        if args.network not in (None, "deny"):
            raise SettingsError("--deny-network", f"contradicts --network {args.network}")
        args.network = "deny"
    if args.allow_domains and args.network is None:
        args.network = "proxy"  # the names are only reachable through the proxy
    for field, f in _FLAGS.items():
        given = getattr(args, field)
        if given is None:
            continue
        flag = f.flags[0]
        if field == "network" and args.deny_network:
            flag = "--deny-network"
        elif field == "wall_time" and args.timeout_alias is not None:
            flag = "--timeout"
        if f.kind == "paths":
            put(field, tuple(_rule_path(flag, p) for p in given), flag)
            continue
        if f.kind == "list":
            given = ",".join(i for text in given for i in text.split(",") if i)
        elif field == "workdir":
            given = os.path.abspath(given)
        try:
            value = from_text(field, given) if isinstance(given, str) else given
            put(field, None if value is None else field_value(field, value), flag)
        except ConfigError as e:
            raise SettingsError(f"{flag} {given}", e.problem, given) from None
    limits, policy = build(values)
    return _Effective(values, sources, limits, policy)


def _rule_path(flag: str, path: str) -> str:
    """A file rule's path: absolute, as Policy takes it.  A relative one is
    refused rather than guessed (this shell's directory, or the program's?)."""
    if not os.path.isabs(path):
        raise SettingsError(
            f"{flag} {path}",
            f"a relative path: give it absolute ({os.path.abspath(path)} from here)",
            path,
        )
    return path


def _check_paths(policy: Policy | None) -> list[str]:
    """What the CLI says about rule paths that do not exist: a --writable
    one can hold nothing (refused); a deny rule still hides what appears
    there later, but is often a typo (a warning)."""
    if policy is None:
        return []
    for path in policy.writable_roots:
        if not os.path.exists(path):
            raise SettingsError(f"--writable {path}", "does not exist", path)
    return [
        f"{flag} {path}: does not exist (a file made there later stays hidden)"
        for flag, field in (("--deny-read", "deny_read"), ("--deny-write", "deny_write"))
        for path in getattr(policy, field)
        if not os.path.lexists(path)
    ]


def _explain(eff: _Effective, cmd: Sequence[str]) -> str:
    """The effective settings, their sources, and what holds each here."""
    from ._cgroup import discover
    from ._plan import plan

    lines = [f"command: {shlex.join(cmd)}"]
    for title, obj in (("limits", eff.limits), ("policy", eff.policy)):
        if obj is None:
            lines.append(f"{title}: none")
            continue
        lines.append(f"{title}:")
        default = type(obj)().to_dict()
        for name, value in obj.to_dict().items():
            if name not in eff.sources and value == default[name]:
                continue
            source = eff.sources.get(name, "default")
            lines.append(f"  {name:<17} {_shown(name, value):<24} {source}")
    if eff.limits is not None or eff.policy is not None:
        held = plan(eff.limits, eff.policy, uid=os.geteuid(), site=discover()).enforced
        lines.append("held by (on this machine):")
        lines += [f"  {name:<17} {how}" for name, how in held.items()]
    return "\n".join(lines) + "\n"


def _shown(name: str, value: Any) -> str:
    if value is None:
        return "unlimited" if name in LIMIT_FIELDS else "automatic"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name in ("memory", "file_size", "disk", "output", "address_space"):
        return format_bytes(value)
    if name in ("cpu_time", "wall_time", "kill_grace"):
        return format_seconds(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "(none)"
    return str(value)


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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        try:
            eff = _settings(args)
            notes = _check_paths(eff.policy)
        except ConfigError as e:
            parser.error(str(e))
    for w in caught:
        print(f"sbxlimit: warning: {w.message}", file=sys.stderr)
    for note in notes:
        print(f"sbxlimit: warning: {note}", file=sys.stderr)
    if args.explain:
        text = _explain(eff, cmd)
        if args.json is not None:
            _emit_json(args.json, {"version": JSON_VERSION, **_settings_doc(eff), "explain": text})
        else:
            print(text, end="")
        return 0
    # The program starts here, as with any command runner, unless told
    # otherwise; a policy's private workspace is then its TMPDIR and the
    # place it may write.
    cwd = os.path.abspath(args.cwd) if args.cwd else None
    if cwd is None and (eff.policy is None or eff.policy.workdir is None):
        cwd = os.getcwd()
    if cwd is not None and not os.path.isdir(cwd):
        parser.error(f"--cwd {args.cwd}: not a directory")

    def fail(status: int, kind: str, message: str) -> int:
        print(f"sbxlimit: {message}", file=sys.stderr)
        if args.json is not None:
            _emit_json(args.json, _error_doc(status, kind, message, cmd, eff))
        return status

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        try:
            proc = Popen(cmd, limits=eff.limits or Limits(), policy=eff.policy, cwd=cwd)
        except UnsupportedError as e:  # before OSError: both can be
            lines = "; ".join(f"{k}: {v}" for k, v in e.items.items())
            return fail(
                EXIT_SETUP,
                "unsupported",
                f"cannot enforce what --strict requires: {lines}. Hint: `sbxlimit doctor` "
                "shows what this machine supports; without --strict it runs with what it "
                "can hold.",
            )
        except SandboxSetupError as e:
            return fail(EXIT_SETUP, "setup", str(e))
        except OSError as e:  # from exec: the program itself
            missing = isinstance(e, FileNotFoundError)
            return fail(
                EXIT_NOTFOUND if missing else EXIT_NOEXEC,
                "not_found" if missing else "not_executable",
                f"{cmd[0]}: {e.strerror}",
            )
    for w in caught:
        text = str(w.message).removeprefix("sbxlimit: ")
        print(f"sbxlimit: warning: {text}", file=sys.stderr)

    grace = eff.limits.kill_grace if eff.limits else 5.0
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
    progress = args.progress and _drawable(sys.stderr)
    try:
        with _foreground(proc.pid), _progress(proc, eff.limits, progress):
            proc.wait()
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)

    # The workspace goes now (kept with --keep-workdir: then its path is in
    # --json), not at interpreter exit.
    proc.close()
    t = proc.termination
    assert t is not None
    if t.is_limit:
        print(f"sbxlimit: {t.message}", file=sys.stderr)
        if eff.sources.get(t.reason) == "--manifest (default)":
            print(
                f"sbxlimit: note: the manifest does not set {t.reason}: this is SPEC section 2's "
                "default for it (--explain lists what a manifest implies)",
                file=sys.stderr,
            )
        status = EXIT_LIMIT
    elif t.signal is not None:
        status = 128 + t.signal
    else:
        status = t.returncode or 0
    if t.reason in ("exited", "signaled") and "Raise the limit if it is that" in t.message:
        # It may not have started under a per-process limit: say which.
        print(f"sbxlimit: note: {t.message.split('. ', 1)[1]}", file=sys.stderr)
    if status != 0 and status != EXIT_LIMIT:
        hint = _read_only_hint(proc, eff.policy, cwd)
        if hint:
            print(f"sbxlimit: note: {hint}", file=sys.stderr)
    refused = sorted({f"{e.host}:{e.port}" for e in proc.network_log() if e.event == "net_denied"})
    if refused:
        print(f"sbxlimit: network: refused {', '.join(refused)}", file=sys.stderr)
    if progress:
        print(_summary(proc, eff.limits), file=sys.stderr, end="")
    if args.json is not None:
        doc = {
            "version": JSON_VERSION,
            "command": os.path.basename(cmd[0]),
            "exit_status": status,
            "error": None,
            "termination": t.to_dict(),
            "usage": proc.usage().to_dict(),
            "enforced": dict(proc.enforced),
            "workspace": proc.workspace,
            "network": [dataclasses.asdict(e) for e in proc.network_log()],
            **_settings_doc(eff),
        }
        _emit_json(args.json, doc)
    return status


def _read_only_hint(proc: Popen, policy: Policy | None, cwd: str | None) -> str:
    """Why a program that failed may have: with file rules, where it
    started is read-only unless it is the workdir or under a writable root."""
    if policy is None or policy.workdir is not None:
        return ""
    here = cwd or os.getcwd()
    if any(here == r or here.startswith(r.rstrip("/") + "/") for r in policy.writable_roots):
        return ""
    return (
        f"the program started in {here}, which is read-only in the sandbox; it may write "
        f"in its private workspace (its TMPDIR). --workdir {here} "
        "makes this directory its writable workspace."
    )


@contextlib.contextmanager
def _progress(proc: Popen, limits: Limits | None, on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    from ._progress import Progress

    with Progress(proc, sys.stderr, limits=limits):
        yield


def _summary(proc: Popen, limits: Limits | None) -> str:
    from ._progress import summary

    return summary(proc, limits)


def _drawable(stream: Any) -> bool:
    from ._progress import drawable

    return drawable(stream)


def _settings_doc(eff: _Effective) -> dict[str, Any]:
    return {
        "limits": eff.limits.to_dict() if eff.limits is not None else None,
        "policy": eff.policy.to_dict() if eff.policy is not None else None,
        "sources": dict(eff.sources),
    }


def _error_doc(
    status: int,
    kind: str,
    message: str,
    cmd: Sequence[str] = (),
    eff: _Effective | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": JSON_VERSION,
        "command": os.path.basename(cmd[0]) if cmd else None,
        "exit_status": status,
        "error": {"kind": kind, "message": message},
    }
    if eff is not None:
        doc.update(_settings_doc(eff))
    return doc


def _emit_json(target: str, doc: dict[str, Any]) -> None:
    """One JSON object: to `target`, or as stdout's last line for "-"."""
    text = json.dumps(doc)
    if target != "-":
        with open(target, "w") as f:
            f.write(text + "\n")
        return
    try:
        sys.stdout.flush()
        print(text, flush=True)
    except BrokenPipeError:
        # Whoever read stdout is gone (`... | head -1`): the status still
        # says how the program ended.  Point stdout at /dev/null so that
        # the interpreter's last flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _alive(proc: subprocess.Popen[Any]) -> bool:
    return proc.poll() is None


def main_entry() -> NoReturn:
    """Console-script entry point."""
    sys.exit(main())
