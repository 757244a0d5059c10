"""``Policy``: what a sandbox may touch (SPEC section 3).

This module validates and normalises; which protections a platform can hold
is decided by ``_plan.plan`` and reported in ``Popen.enforced``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Never

from ._errors import ConfigError, UnknownFieldError
from ._limits import coerce_fields

__all__ = ["CAPABILITIES", "DOTFILES", "DOTFILES_DARWIN", "Policy"]

NetworkMode = Literal["allow", "deny", "proxy"]

# Protected by protect_dotfiles=True, relative to $HOME: what shells (login
# or not, bash and zsh) and git run code from later, outside the sandbox.
# (".git/hooks" and ".git/config" are protected in the repositories under
# the workspace and writable roots too.)
DOTFILES = (
    ".bash_login",
    ".bash_profile",
    ".bashrc",
    ".profile",
    ".zlogin",
    ".zprofile",
    ".zshenv",
    ".zshrc",
    ".gitconfig",
    ".config/git/config",
    ".ssh",
)
# macOS also starts at login what ~/Library/LaunchAgents names.
DOTFILES_DARWIN = ("Library/LaunchAgents",)

# Linux capabilities by number (linux/capability.h), for Policy.capabilities.
CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
)
_ENV_NAME = re.compile(r"^[^=\0]+$")
# drop_secrets: names that usually hold credentials (AWS_SECRET_ACCESS_KEY,
# GITHUB_TOKEN, OPENAI_API_KEY, PGPASSWORD ...), in any case.
_SECRET = re.compile(r"KEY|SECRET|TOKEN|PASSWORD", re.IGNORECASE)
_SECRET_BYTES = re.compile(_SECRET.pattern.encode(), re.IGNORECASE)


def environ_bytes() -> dict[bytes, bytes]:
    """A copy of this process's environment with bytes keys and values, as
    os.environ holds it (iterating os.environ decodes every entry)."""
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict) and all(type(k) is bytes for k in data):
        return dict(data)
    return dict(os.environb)


def put_env(env: dict[Any, Any], name: str, value: str) -> None:
    """env[name] = value in env's own key type, replacing either form."""
    raw = os.fsencode(name)
    if any(type(k) is bytes for k in env):
        env.pop(name, None)
        env[raw] = os.fsencode(value)
    else:
        env.pop(raw, None)
        env[name] = value


def _path(field: str, value: object) -> str:
    try:
        text = os.fspath(value)  # type: ignore[call-overload]
    except TypeError:
        raise ConfigError(field, value, "expected a path (str or os.PathLike)") from None
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\0" in text:
        raise ConfigError(field, value, "contains a NUL byte")
    if not os.path.isabs(text):
        raise ConfigError(field, value, "must be an absolute path")
    return str(os.path.normpath(text))


def _paths(field: str, value: object) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(field, value, "expected a list of absolute paths")
    return tuple(_path(f"{field}[{i}]", v) for i, v in enumerate(value))


def _capabilities(value: object) -> tuple[str, ...]:
    """Capability names, normalised to ``CAP_*`` and sorted."""
    field = "Policy.capabilities"
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(field, value, "expected a list of capability names")
    out = set()
    for v in value:
        name = v.upper() if isinstance(v, str) else v
        if isinstance(name, str) and not name.startswith("CAP_"):
            name = "CAP_" + name
        if name not in CAPABILITIES:
            raise ConfigError(field, v, "not a Linux capability name (CAP_NET_BIND_SERVICE, ...)")
        out.add(name)
    return tuple(sorted(out, key=CAPABILITIES.index))


PathArg = str | os.PathLike[str] | bytes


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class Policy:
    """What a sandbox may touch.  Immutable; validated on construction.

    Each protection is held by the best mechanism the platform has
    (docs/platform-matrix.md); ``Popen.enforced`` names it, or says
    ``unenforced: <why>`` (a ``RuntimeWarning`` once per process, or
    ``UnsupportedError`` before anything starts with ``strict=True``).

    Fields:
        workdir: None for a private 0700 temp workspace (removed at close
            unless ``keep_workdir``), else an absolute path used as is.
        keep_workdir: leave the private workspace in place after close.
        writable_roots: absolute paths the child may write, besides the
            workspace and a private tmp.
        deny_read: absolute paths the child may not read.
        deny_write: absolute paths the child may not write.
        protect_dotfiles: deny writes to ~/.bashrc, ~/.zshrc, ~/.profile,
            ~/.gitconfig, ~/.ssh and .git/hooks.
        network: ``"allow"``, ``"deny"`` (Linux: a network namespace with
            only its own loopback, else Landlock TCP and seccomp socket
            rules), or ``"proxy"`` (only TCP connects to ``proxy_ports``;
            proxy environment variables set).
        proxy_ports: loopback TCP ports reachable with ``network="proxy"``
            (a proxy of your own).
        allow_domains: with ``network="proxy"``, sbxlimit's own filtering
            proxy is the program's one way out, and these are the names it
            may reach: ``"pypi.org"``, ``"*.github.com"`` (names below it),
            ``"example.com:443"`` (that port only), IP addresses and networks
            (``"203.0.113.7"``, ``"10.0.0.0/8"``).  Names are resolved by
            the proxy; an IP literal, or a name resolving to a loopback,
            private or link-local address, is refused unless listed.
        deny_domains: names (same forms) refused even when allowed.
        proxy_connections: connections the program may hold open through
            the proxy at once (default 64).
        proxy_bytes: bytes through the proxy, both ways, in all; past it
            connections are cut and new ones refused (default: no cap).
        unix_sockets: absolute paths of Unix-domain sockets the program may
            connect to (macOS: besides the system's logging and
            name-resolution sockets, every other one is refused, whatever
            ``network`` says: the Docker socket, ssh-agent, tmux run code
            outside the sandbox).  On Linux, sockets are file rules'
            business: ``deny_read`` removes one from the sandbox's view.
        env: ``"sanitize"`` drops ``LD_*`` and ``DYLD_*``; a list of names
            keeps only those variables.
        drop_secrets: also drop variables whose name contains ``KEY``,
            ``SECRET``, ``TOKEN`` or ``PASSWORD`` (any case), even when an
            allow-list names them.
        harden: no_new_privs, and on Linux a seccomp filter: no new
            namespaces, device nodes, typing into terminals, signals to the
            caller, sockets of other families than unix, IPv4/IPv6 and
            netlink routes; ptrace, bpf, mount, kernel keys and the like
            refused (EPERM).  Core dumps are off in every sandbox regardless.
        capabilities: Linux capabilities a sandbox of a privileged caller
            keeps (``["CAP_NET_BIND_SERVICE"]``); every other one is dropped,
            so a root program runs without privilege (default: none).
        terminal: keep the caller's session and controlling terminal (job
            control and Ctrl-C reach the program).  By default a policy
            sandbox gets a session of its own, with no controlling terminal,
            so it cannot push input into the caller's (docs/SECURITY.md).
        isolate_pids: a PID namespace of its own (Linux): the program runs
            as PID 2 under a small reaper as PID 1, and everything it
            started dies with it, a double fork that changed session
            included.  ``None`` (default): wherever no cgroup holds the
            sandbox (without one, the process-tree walk misses such a
            double fork) and a namespace can be made; ``True``: always;
            ``False``: never.
        strict: raise :class:`UnsupportedError` before starting if anything
            asked for cannot be enforced here (default: apply what can be
            and record the rest in ``Popen.enforced``).
    """

    workdir: str | None = None
    keep_workdir: bool = False
    writable_roots: tuple[str, ...] = ()
    deny_read: tuple[str, ...] = ()
    deny_write: tuple[str, ...] = ()
    protect_dotfiles: bool = True
    network: NetworkMode = "allow"
    proxy_ports: tuple[int, ...] = ()
    allow_domains: tuple[str, ...] = ()
    deny_domains: tuple[str, ...] = ()
    proxy_connections: int = 64
    proxy_bytes: int | None = None
    unix_sockets: tuple[str, ...] = ()
    env: Literal["sanitize"] | tuple[str, ...] = "sanitize"
    drop_secrets: bool = False
    harden: bool = True
    isolate_pids: bool | None = None
    capabilities: tuple[str, ...] = ()
    terminal: bool = False
    strict: bool = False

    def __init__(
        self,
        *,
        workdir: PathArg | None = None,
        keep_workdir: bool = False,
        writable_roots: Iterable[PathArg] = (),
        deny_read: Iterable[PathArg] = (),
        deny_write: Iterable[PathArg] = (),
        protect_dotfiles: bool = True,
        network: NetworkMode = "allow",
        proxy_ports: Iterable[int] = (),
        allow_domains: Iterable[str] = (),
        deny_domains: Iterable[str] = (),
        proxy_connections: int | str = 64,
        proxy_bytes: int | str | None = None,
        unix_sockets: Iterable[PathArg] = (),
        env: Literal["sanitize"] | Iterable[str] = "sanitize",
        drop_secrets: bool = False,
        harden: bool = True,
        isolate_pids: bool | None = None,
        capabilities: Iterable[str] = (),
        terminal: bool = False,
        strict: bool = False,
        **unknown: Never,
    ) -> None:
        if unknown:
            raise UnknownFieldError("Policy", unknown, _FIELD_NAMES)

        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        for name, value in (
            ("workdir", workdir),
            ("keep_workdir", keep_workdir),
            ("writable_roots", writable_roots),
            ("deny_read", deny_read),
            ("deny_write", deny_write),
            ("protect_dotfiles", protect_dotfiles),
            ("network", network),
            ("proxy_ports", proxy_ports),
            ("allow_domains", allow_domains),
            ("deny_domains", deny_domains),
            ("proxy_connections", proxy_connections),
            ("proxy_bytes", proxy_bytes),
            ("unix_sockets", unix_sockets),
            ("env", env),
            ("drop_secrets", drop_secrets),
            ("harden", harden),
            ("isolate_pids", isolate_pids),
            ("capabilities", capabilities),
            ("terminal", terminal),
            ("strict", strict),
        ):
            put(name, value)

        if self.workdir is not None:
            put("workdir", _path("Policy.workdir", self.workdir))
        for name in ("writable_roots", "deny_read", "deny_write", "unix_sockets"):
            put(name, _paths(f"Policy.{name}", getattr(self, name)))
        for name in (
            "keep_workdir",
            "protect_dotfiles",
            "drop_secrets",
            "harden",
            "terminal",
            "strict",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"Policy.{name}", getattr(self, name), "expected a bool")
        if self.isolate_pids is not None and not isinstance(self.isolate_pids, bool):
            raise ConfigError(
                "Policy.isolate_pids", self.isolate_pids, "expected a bool or None (automatic)"
            )
        put("capabilities", _capabilities(self.capabilities))
        if self.network not in ("allow", "deny", "proxy"):
            raise ConfigError("Policy.network", self.network, "expected 'allow', 'deny' or 'proxy'")
        ports = self.proxy_ports
        if isinstance(ports, (str, bytes)) or not isinstance(ports, Iterable):
            raise ConfigError("Policy.proxy_ports", ports, "expected a list of TCP ports")
        checked = []
        for p in ports:
            if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
                raise ConfigError("Policy.proxy_ports", p, "expected a TCP port 1..65535")
            checked.append(p)
        put("proxy_ports", tuple(sorted(set(checked))))
        _domains(self, put)
        if self.network == "proxy" and not (self.proxy_ports or self.allow_domains):
            raise ConfigError(
                "Policy.proxy_ports",
                (),
                "network='proxy' needs allow_domains (sbxlimit's own proxy) or proxy_ports "
                "(your own)",
            )
        if self.proxy_ports and self.allow_domains:
            raise ConfigError(
                "Policy.proxy_ports",
                self.proxy_ports,
                "give allow_domains (sbxlimit's own proxy) or proxy_ports (your own), not both",
            )
        for name in ("proxy_ports", "allow_domains", "deny_domains"):
            if self.network != "proxy" and getattr(self, name):
                raise ConfigError(
                    f"Policy.{name}", getattr(self, name), "only meaningful with network='proxy'"
                )
        env = self.env
        if env != "sanitize":
            if isinstance(env, (str, bytes)) or not isinstance(env, Iterable):
                raise ConfigError(
                    "Policy.env", env, "expected 'sanitize' or a list of variable names"
                )
            names = tuple(env)
            for n in names:
                if not isinstance(n, str) or not _ENV_NAME.match(n):
                    raise ConfigError("Policy.env", n, "not a valid environment variable name")
            put("env", names)

    @classmethod
    def coerce(cls, value: Policy | Mapping[str, Any] | None) -> Policy | None:
        """Accept a Policy, a mapping of its fields, or None."""
        return coerce_fields(cls, value, "policy")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    def seatbelt_profile(
        self,
        *,
        workspace: str | None = None,
        home: str | None = None,
        ttys: Iterable[str] = (),
        workspaces_root: str | None = None,
        protected: Iterable[str] | None = None,
    ) -> str:
        """The macOS Seatbelt (SBPL) profile this policy becomes, on any OS
        (a preview: docs/seatbelt.md).

        `workspace` defaults to ``workdir``; `home` (for dotfile protection)
        to ``~``; `ttys`: the terminal devices on the sandbox's stdio;
        `workspaces_root`: where private workspaces are made (the temp
        dir); `protected`: what ``protect_dotfiles`` protects besides every
        ``.git/hooks`` and ``.git/config`` (default: HOME's dotfiles, as
        links and as their targets, and the git directories found under the
        writable roots).  Paths are canonicalised as macOS sees them
        (symlinks resolved, ``/tmp`` → ``/private/tmp``).  Raises
        ConfigError for a path a profile cannot hold (control characters).
        """
        import tempfile

        from . import _core, _protected

        canon = _core.seatbelt_canonical
        ws = workspace if workspace is not None else self.workdir
        if protected is None and self.protect_dotfiles:
            home = home if home is not None else os.path.expanduser("~")
            roots = [ws] if ws else []
            protected = _protected.protected(
                home, [*roots, *self.writable_roots], darwin=True
            ).paths
        root = workspaces_root if workspaces_root is not None else tempfile.gettempdir()
        network = {"allow": 0, "deny": 1, "proxy": 2}[self.network]
        if self.network == "proxy" and not self.proxy_ports:
            network = 1  # allow_domains: no proxy on macOS yet, so nothing gets out
        try:
            return _core.seatbelt_profile(
                workspace=canon(ws) if ws else None,
                workspaces_root=canon(root),
                writable_roots=[canon(p) for p in self.writable_roots],
                deny_read=[canon(p) for p in self.deny_read],
                deny_write=[canon(p) for p in self.deny_write],
                protect_dotfiles=self.protect_dotfiles,
                protected_paths=[_canonical_link(canon, p) for p in protected or ()],
                ttys=[canon(t) for t in ttys],
                unix_sockets=[canon(p) for p in self.unix_sockets],
                network=network,
                proxy_ports=list(self.proxy_ports),
            )
        except ValueError as e:
            raise ConfigError("Policy", str(e), "cannot be expressed in a Seatbelt profile") from e

    def filter_env(self, env: Mapping[Any, Any]) -> dict[Any, Any]:
        """The environment the child gets under this policy (str or bytes keys)."""
        if isinstance(env, dict) and env and all(type(k) is bytes for k in env):
            return self._filter_env_bytes(env)

        def name(k: Any) -> str:
            return os.fsdecode(k) if isinstance(k, bytes) else str(k)

        if self.env == "sanitize":
            out = {
                k: v
                for k, v in env.items()
                if not (name(k).startswith("LD_") or name(k).startswith("DYLD_"))
            }
        else:
            keep = set(self.env)
            out = {k: v for k, v in env.items() if name(k) in keep}
        if self.drop_secrets:
            out = {k: v for k, v in out.items() if not _SECRET.search(name(k))}
        return out

    def _filter_env_bytes(self, env: dict[bytes, bytes]) -> dict[bytes, bytes]:
        # The caller's own environment as the OS gave it (environ_bytes):
        # no key or value decoded.
        if self.env == "sanitize":
            out = {k: v for k, v in env.items() if not k.startswith((b"LD_", b"DYLD_"))}
        else:
            keep = {os.fsencode(n) for n in self.env}
            out = {k: v for k, v in env.items() if k in keep}
        if self.drop_secrets:
            out = {k: v for k, v in out.items() if not _SECRET_BYTES.search(k)}
        return out


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Policy))


def _domains(policy: Policy, put: Any) -> None:
    """allow_domains, deny_domains and the proxy's limits, checked: each
    entry by the proxy's own parser, so that what is accepted here is what
    it enforces."""
    from ._units import parse_bytes, parse_count

    for name in ("allow_domains", "deny_domains"):
        value = getattr(policy, name)
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise ConfigError(f"Policy.{name}", value, "expected a list of names")
        entries = tuple(value)
        for e in entries:
            if not isinstance(e, str):
                raise ConfigError(f"Policy.{name}", e, "expected a name such as 'pypi.org'")
        put(name, entries)
    if policy.allow_domains or policy.deny_domains:
        from ._proxy import Rules

        for name, allow, deny in (
            ("allow_domains", policy.allow_domains, ()),
            ("deny_domains", (), policy.deny_domains),
        ):
            try:
                Rules.parse(allow, deny)
            except ValueError as e:
                raise ConfigError(f"Policy.{name}", getattr(policy, name), str(e)) from None
    put("proxy_connections", parse_count("Policy.proxy_connections", policy.proxy_connections))
    if policy.proxy_bytes is not None:
        put("proxy_bytes", parse_bytes("Policy.proxy_bytes", policy.proxy_bytes))


def _canonical_link(canon: Any, path: str) -> str:
    """`path` as Seatbelt names it, but a symbolic link stays itself (its
    directory resolved): a rule on the link refuses replacing it, a rule on
    its target (listed too) writing through it."""
    if os.path.islink(path):
        return os.path.join(canon(os.path.dirname(path)), os.path.basename(path))
    return str(canon(path))
