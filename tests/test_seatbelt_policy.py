"""Policy.seatbelt_profile(): the C builder (csrc/darwin/seatbelt.c) through
the extension, on every OS.  The builder's own cases are in
tests/c/test_seatbelt.c."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sbxlimit
from sbxlimit import Policy, _core, _workspace

canon = _core.seatbelt_canonical


def profile(**kw) -> str:
    return Policy(**kw).seatbelt_profile(
        workspace="/tmp/ws", home="/Users/me", workspaces_root="/tmp"
    )


# -- a reader of SBPL, to check what a profile says rather than its bytes ----

_TOKEN = re.compile(r'\s+|;[^\n]*|\(|\)|#"(?:\\.|[^"\\])*"|"(?:\\.|[^"\\])*"|[^\s()";]+')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n", "\\t": "\t"}


def sbpl(text: str) -> list:
    """The profile as nested lists; strings as ("str", value), regexes as
    ("re", source).  Refuses anything it cannot read whole."""
    stack: list[list] = [[]]
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m, f"unreadable at {pos}: {text[pos : pos + 40]!r}"
        tok, pos = m.group(), m.end()
        if tok.isspace() or tok.startswith(";"):
            continue
        if tok == "(":
            stack.append([])
        elif tok == ")":
            done = stack.pop()
            stack[-1].append(done)
        elif tok.startswith('#"'):
            stack[-1].append(("re", tok[2:-1]))
        elif tok.startswith('"'):
            value = re.sub(r"\\.", lambda e: _UNESCAPE[e.group()], tok[1:-1])
            stack[-1].append(("str", value))
        else:
            stack[-1].append(tok)
    assert len(stack) == 1, "unbalanced parentheses"
    return stack[0]


def shape(form: object) -> object:
    """A form with every caller string replaced by one placeholder."""
    if isinstance(form, list):
        return [shape(f) for f in form]
    if isinstance(form, tuple) and form[0] == "str":
        return "STR"
    return form


def strings(form: object) -> set[str]:
    if isinstance(form, list):
        return set().union(*(strings(f) for f in form)) if form else set()
    if isinstance(form, tuple) and form[0] == "str":
        return {form[1]}
    return set()


def regexes(form: object) -> list[str]:
    if isinstance(form, list):
        return [r for f in form for r in regexes(f)]
    if isinstance(form, tuple) and form[0] == "re":
        return [form[1]]
    return []


GIT_RULE = ("re", "/\\.git/((modules|worktrees)/.+/)?(hooks(/|$)|config(\\.worktree)?$)")


# -- the profile -------------------------------------------------------------


def test_deny_default_then_allows_then_denies():
    text = profile(deny_read=["/Users/me/.aws"], writable_roots=["/opt/data"])
    assert text.startswith("(version 1)\n")
    assert text.index("(deny default)") < text.index("(allow file-read*)")
    assert text.index("(allow file-read*)") < text.index(
        '(deny file-read*\n    (subpath "/Users/me/.aws"))'
    )
    assert '(subpath "/private/tmp/ws")' in text  # /tmp is /private/tmp on macOS
    assert '(subpath "/opt/data")' in text
    # Dotfile protection comes after every write allow: the last rule wins.
    assert text.rindex("(allow file-write*") < text.index('(subpath "/Users/me/.ssh")')
    assert text.endswith("(deny file-ioctl (ioctl-command TIOCSTI))\n")


def test_deterministic_and_order_independent():
    a = profile(writable_roots=["/b", "/a", "/a"], deny_write=["/y", "/x"])
    b = profile(writable_roots=["/a", "/b"], deny_write=["/x", "/y"])
    assert a == b


def test_network_modes():
    denied = profile(network="deny")
    assert "(allow network*)" not in denied and "remote ip" not in denied
    assert "(allow network*)" in profile()
    proxied = profile(network="proxy", proxy_ports=[3128, 8080])
    assert '(remote ip "localhost:3128")' in proxied and '(remote ip "localhost:8080")' in proxied
    assert "(allow network*)" not in proxied


def test_strings_are_escaped_and_control_characters_refused(tmp_path):
    text = profile(writable_roots=['/data/a "quoted" dir', "/data/back\\slash"])
    assert '(subpath "/data/a \\"quoted\\" dir")' in text
    assert '(subpath "/data/back\\\\slash")' in text
    with pytest.raises(sbxlimit.ConfigError, match="Seatbelt"):
        profile(writable_roots=["/data/bell\x07"])
    with pytest.raises(sbxlimit.ConfigError, match="Seatbelt"):
        profile(unix_sockets=["/run/bell\x07.sock"])


def test_symlinks_are_resolved(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    text = Policy(writable_roots=[str(tmp_path / "link" / "sub")]).seatbelt_profile()
    assert f'(subpath "{real}/sub")'.replace('"/tmp/', '"/private/tmp/') in text


def test_cli_prints_the_profile():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sbxlimit",
            "seatbelt-profile",
            "--proxy-port",
            "3128",
            "--unix-socket",
            "/var/sbx-missing/my.sock",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, TMPDIR="/tmp"),
    )
    assert r.returncode == 0 and '(remote ip "localhost:3128")' in r.stdout
    assert '(remote unix-socket (subpath "/private/var/sbx-missing/my.sock"))' in r.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "sbxlimit", "seatbelt-profile", "--writable", "rel"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "absolute" in bad.stderr


def test_every_repositorys_hooks_and_config_are_protected_at_any_depth():
    # The profile's one git rule, read as the regex SBPL gives it.
    text = Policy(writable_roots=["/Users/me"]).seatbelt_profile(home="/Users/me")
    (pattern,) = re.findall(r'\(regex #"(/\\\.git/[^"]*)"\)', text)
    rule = re.compile(pattern)
    denied = [
        "/Users/me/proj/.git/hooks",
        "/Users/me/proj/.git/hooks/pre-commit",
        "/Users/me/a/b/c/.git/hooks/post-checkout",
        "/Users/me/proj/.git/config",
        "/Users/me/a/b/c/.git/config",
        "/Users/me/proj/.git/modules/sub/hooks/pre-push",
        "/Users/me/proj/.git/modules/sub/config",
        "/Users/me/proj/.git/worktrees/wt/config.worktree",
    ]
    allowed = [
        "/Users/me/proj/.git/index.lock",
        "/Users/me/proj/.git/objects/ab/cdef",
        "/Users/me/proj/.git/configx",
        "/Users/me/proj/config",
        "/Users/me/proj/hooks/x",
        "/Users/me/proj/not.git/hooks/x",
    ]
    assert [p for p in denied if not rule.search(p)] == []
    assert [p for p in allowed if rule.search(p)] == []


def test_dotfiles_are_denied_as_links_and_as_their_targets(tmp_path):
    # ~/.zshrc -> dotfiles/zshrc and ~/.config -> dotfiles/config: Seatbelt
    # matches the resolved path of a write through a link, and the link's
    # own path when the link itself is replaced.
    home = tmp_path / "home"
    dots = tmp_path / "dotfiles"
    (dots / "config" / "git").mkdir(parents=True)
    (dots / "zshrc").write_text("# rc\n")
    home.mkdir()
    (home / ".zshrc").symlink_to(dots / "zshrc")
    (home / ".config").symlink_to(dots / "config")
    text = Policy(workdir=str(home)).seatbelt_profile(home=str(home))
    forms = sbpl(text)
    (dotrule,) = [f for f in forms if ["regex", GIT_RULE] in f]
    denied = strings(dotrule)
    h, d = canon(str(home)), canon(str(dots))
    assert {f"{h}/.zshrc", f"{d}/zshrc"} <= denied  # the link, and what it points to
    assert {f"{h}/.config", f"{d}/config/git/config"} <= denied  # a link on the way too
    want = [".zshenv", ".zlogin", ".bash_login", ".ssh", "Library/LaunchAgents"]
    assert [n for n in want if f"{h}/{n}" not in denied] == []
    # The home itself stays writable: it is the workspace here.
    assert f"{h}/.zshrc" not in strings([f for f in forms if f[0] == "allow"])


def test_other_sandboxes_workspaces_are_neither_read_nor_written(tmp_path):
    # The rule's regex matches every workspace sbxlimit makes, and the
    # sandbox's own comes back after it.
    mine = _workspace.create("1f-1")
    theirs = _workspace.create("2e-7")
    try:
        text = Policy().seatbelt_profile(workspace=mine, workspaces_root=os.path.dirname(mine))
        forms = sbpl(text)
        (others,) = [f for f in forms if f and f[0] == "deny" and "require-all" in str(f)]
        assert others[1:4] == ["file-read*", "file-write*", "file-link"]
        (_, subpath, regex) = others[4]
        assert subpath == ["subpath", ("str", canon(os.path.dirname(mine)))]
        pattern = re.compile(regex[1][1])
        assert pattern.search(canon(theirs)) and pattern.search(canon(theirs) + "/tmp/x")
        assert not pattern.search(canon(os.path.dirname(mine)) + "/sbxlimit-doctor-x")
        # Its own: allowed again after the deny, read and write.
        again = forms.index(others) + 1
        assert forms[again] == [
            "allow",
            "file-read*",
            "file-write*",
            "file-link",
            ["subpath", ("str", canon(mine))],
        ]
        # No blanket temp dir: only its own workspace is allowed.
        allowed = strings([f for f in forms if f[0] == "allow"])
        assert canon(os.path.dirname(mine)) not in allowed
        assert "/private/var/folders" not in allowed and "/private/tmp" not in allowed
    finally:
        _workspace.remove(mine)
        _workspace.remove(theirs)


def test_unix_sockets_in_every_mode():
    for network, extra in (("allow", {}), ("deny", {}), ("proxy", {"proxy_ports": [3128]})):
        forms = sbpl(
            profile(network=network, unix_sockets=["/Users/me/.colima/docker.sock"], **extra)
        )
        outbound = [
            f for f in forms if f[:2] == ["allow", "network-outbound"] and "unix-socket" in str(f)
        ]
        reachable = set().union(*(strings(f) for f in outbound))
        want = {"/private/tmp/ws", "/private/var/run/syslog", "/Users/me/.colima/docker.sock"}
        if network == "allow":
            want.add("/private/var/run/mDNSResponder")
            # (allow network*) allowed every connect: taken back before the list.
            deny = forms.index(["deny", "network-outbound", ["remote", "unix-socket"]])
            assert forms.index(["allow", "network*"]) < deny < forms.index(outbound[0])
        assert reachable == want, network


# -- no caller path can widen a rule ------------------------------------------

# Path components made of what could break out of a string or a rule: quotes,
# backslashes, parentheses, comment and regex markers, newlines, tabs.
_nasty = st.text(
    alphabet=st.sampled_from(list('abc"\\()#;|*.^$\n\t ')), min_size=1, max_size=12
).filter(lambda s: s not in (".", "..") and "/" not in s)
_FIELDS = ("writable_roots", "deny_read", "deny_write", "unix_sockets")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    names=st.lists(_nasty, min_size=len(_FIELDS) + 2, max_size=len(_FIELDS) + 2),
    network=st.sampled_from(["allow", "deny", "proxy"]),
)
def test_no_caller_path_can_widen_a_rule(names, network):
    # Every caller path becomes exactly one string of the same rules as a
    # plain path would: same forms, same operations, same filters.
    def build(parts):
        fields = {f: [f"/p{i}/{parts[i]}"] for i, f in enumerate(_FIELDS)}
        ports = {"proxy_ports": [3128]} if network == "proxy" else {}
        policy = Policy(network=network, **fields, **ports)
        text = policy.seatbelt_profile(
            workspace=f"/ws/{parts[-2]}",
            workspaces_root=f"/root/{parts[-1]}",
            ttys=[f"/dev/{parts[-2]}"],
            protected=[f"/home/{parts[-1]}"],
        )
        return sbpl(text), fields

    hostile, fields = build(names)
    plain, _ = build([f"n{i}" for i in range(len(names))])
    assert shape(hostile) == shape(plain)
    said = strings(hostile)
    for paths in fields.values():
        assert {canon(p) for p in paths} <= said
    assert canon(f"/ws/{names[-2]}") in said and canon(f"/home/{names[-1]}") in said
    # Regexes are the builder's own, whatever the input.
    assert regexes(hostile) == regexes(plain)
