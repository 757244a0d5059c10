"""Policy.seatbelt_profile(): the C builder (csrc/darwin/seatbelt.c) through
the extension, on every OS.  The builder's own cases are in
tests/c/test_seatbelt.c."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import sbxlimit
from sbxlimit import Policy


def profile(**kw) -> str:
    return Policy(**kw).seatbelt_profile(workspace="/tmp/ws", home="/Users/me", tmpdir="/tmp")


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


def test_deterministic_and_order_independent():
    a = profile(writable_roots=["/b", "/a", "/a"], deny_write=["/y", "/x"])
    b = profile(writable_roots=["/a", "/b"], deny_write=["/x", "/y"])
    assert a == b


def test_network_modes():
    assert "network" not in profile(network="deny").split("(deny default)")[1].split("; Network")[
        0
    ] or "(allow network*)" not in profile(network="deny")
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


def test_symlinks_are_resolved(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    text = Policy(writable_roots=[str(tmp_path / "link" / "sub")]).seatbelt_profile()
    assert f'(subpath "{real}/sub")'.replace('"/tmp/', '"/private/tmp/') in text


def test_cli_prints_the_profile():
    r = subprocess.run(
        [sys.executable, "-m", "sbxlimit", "seatbelt-profile", "--proxy-port", "3128"],
        capture_output=True,
        text=True,
        env=dict(os.environ, TMPDIR="/tmp"),
    )
    assert r.returncode == 0 and '(remote ip "localhost:3128")' in r.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "sbxlimit", "seatbelt-profile", "--writable", "rel"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "absolute" in bad.stderr


def test_every_repositorys_hooks_and_config_are_protected_at_any_depth():
    # The profile's one git rule, read as the regex SBPL gives it.
    import re

    profile = Policy(writable_roots=["/Users/me"]).seatbelt_profile(home="/Users/me")
    (pattern,) = re.findall(r'\(regex #"(/\\\.git/[^"]*)"\)', profile)
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
