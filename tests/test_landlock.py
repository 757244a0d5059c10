"""Landlock file rules: real denials from the kernel."""

from __future__ import annotations

import subprocess

import pytest

import sbxlimit
from sbxlimit import Policy, _core
from sbxlimit._landlock import subtract

from .conftest import kept_in_a_fork, why_not

pytestmark = pytest.mark.skipif(
    _core.landlock_abi() < 1, reason=f"no Landlock here ({why_not('landlock')})"
)


# Landlock as the whole file mechanism, as where no mount namespace can be
# made (tests/test_file_rules.py: the read-only view on top).
pytestmark = [pytestmark, pytest.mark.usefixtures("no_namespaces")]


def sh(script: str, **policy) -> dict[str, int]:
    """Run `script` (lines `NAME command`) and return each command's status."""
    lines = [ln.strip().split(" ", 1) for ln in script.strip().splitlines()]
    body = "\n".join(f"{cmd} >/dev/null 2>&1; echo {name}=$?" for name, cmd in lines)
    with sbxlimit.Popen(
        ["sh", "-c", body], policy=Policy(**policy), stdout=subprocess.PIPE, text=True
    ) as p:
        out = p.communicate()[0]
    return {k: int(v) for k, v in (ln.split("=") for ln in out.split())}


@pytest.fixture
def tree(tmp_path):
    for d in ("open/sub/deny", "open/.git/hooks", "secret"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "secret" / "key").write_text("k")
    (tmp_path / "open" / "f").write_text("o")
    (tmp_path / "open" / "sub" / "g").write_text("g")
    return tmp_path


def test_reads_everywhere_but_deny_read(tree):
    r = sh(
        f"""
        open cat {tree}/open/f
        secret cat {tree}/secret/key
        listing ls {tree}/secret
        etc cat /etc/hostname
        """,
        deny_read=[str(tree / "secret")],
    )
    assert r == {"open": 0, "secret": 1, "listing": 2, "etc": 0}


def test_writes_only_where_allowed(tree):
    r = sh(
        f"""
        workspace touch made-here
        tmpdir touch $TMPDIR/x
        root_file touch {tree}/open/sub/g
        outside touch {tree}/elsewhere
        slash_tmp touch /tmp/sbx-landlock-should-fail
        devnull sh -c 'echo x > /dev/null'
        hooks touch {tree}/open/.git/hooks/pre-commit
        deny_write touch {tree}/open/sub/deny/x
        """,
        writable_roots=[str(tree / "open")],
        deny_write=[str(tree / "open" / "sub" / "deny")],
    )
    assert r == {
        "workspace": 0,
        "tmpdir": 0,
        "root_file": 0,
        "outside": 1,
        "slash_tmp": 1,
        "devnull": 0,
        "hooks": 1,
        "deny_write": 1,
    }
    assert not (tree / "elsewhere").exists()


def test_dotfiles_protected_in_a_writable_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".bashrc").write_text("# rc\n")
    (home / "notes.txt").write_text("n")
    monkeypatch.setenv("HOME", str(home))
    r = sh(
        f"""
        bashrc sh -c 'echo evil >> {home}/.bashrc'
        ssh touch {home}/.ssh/authorized_keys
        notes sh -c 'echo ok >> {home}/notes.txt'
        """,
        writable_roots=[str(home)],
    )
    assert r == {"bashrc": 2, "ssh": 1, "notes": 0}
    assert (home / ".bashrc").read_text() == "# rc\n"


def test_a_dotfile_that_is_a_link_is_protected_as_link_and_target(tmp_path, monkeypatch):
    # Landlock alone: the link is carved as itself, so HOME keeps no right
    # to replace it; its target refuses writes.
    from .test_file_rules import LINK_ATTACKS, check_link_attacks, link_roots, linked_home

    h = linked_home(tmp_path, monkeypatch)
    check_link_attacks(h, sh(LINK_ATTACKS.format(h=h), writable_roots=link_roots(h)))


def test_the_documented_limit_new_entries_in_a_carved_directory(tree):
    # open/ is carved around open/.git/hooks: what exists in it stays
    # writable, but a new entry directly in it has no rule (docs/SECURITY.md).
    r = sh(
        f"""
        existing touch {tree}/open/f
        new touch {tree}/open/brand-new
        """,
        writable_roots=[str(tree / "open")],
    )
    assert r == {"existing": 0, "new": 1}


def test_subtract_carves_siblings(tree):
    got = subtract([str(tree)], [str(tree / "open" / "sub" / "deny")])
    assert str(tree / "secret") in got and str(tree / "open" / "f") in got
    assert str(tree / "open" / "sub" / "g") in got
    assert not [p for p in got if p.startswith(str(tree / "open" / "sub" / "deny"))]
    assert str(tree) not in got and str(tree / "open") not in got
    # A denied path that does not exist leaves the root whole.
    assert subtract([str(tree)], [str(tree / "nope")]) == [str(tree)]
    # A symlink among the siblings is not allowed: it could lead back in.
    (tree / "back").symlink_to(tree / "open")
    assert str(tree / "back") not in subtract([str(tree)], [str(tree / "open" / "f")])
    # A root inside a denied tree disappears.
    assert subtract([str(tree / "secret")], [str(tree)]) == []


def test_enforced_and_no_downgrade_warning(recwarn):
    r = sbxlimit.run(["true"], policy=Policy(writable_roots=["/opt"]))
    assert r.enforced["files"].startswith(f"landlock:abi{_core.landlock_abi()} (")
    assert "landlock:" in r.enforced["protect_dotfiles"]
    assert not [w for w in recwarn if "files" in str(w.message)]


def test_a_kept_ruleset_follows_the_directory_its_workdir_names(tmp_path):
    # The ruleset of a workdir is kept for the next spawn.  Moved away and
    # made anew, the workdir is the new directory: the old one, wherever
    # it went, is no longer writable.
    w = tmp_path / "w"
    w.mkdir()
    assert sh(f"a touch {w}/a", workdir=str(w)) == {"a": 0}
    w.rename(tmp_path / "old")
    w.mkdir()
    r = sh(f"new touch {w}/b\nold touch {tmp_path}/old/c", workdir=str(w))
    assert r == {"new": 0, "old": 1}


def test_the_same_rules_make_one_ruleset(tmp_path, monkeypatch):
    made = []
    real = _core.landlock_ruleset

    def counting(*args):
        made.append(args[1])
        return real(*args)

    monkeypatch.setattr(_core, "landlock_ruleset", counting)
    for _ in range(3):
        assert sh(f"a touch {tmp_path}/a", workdir=str(tmp_path)) == {"a": 0}
    assert len(made) == 1
    # A workspace made for the sandbox is never seen again: not kept.
    for _ in range(2):
        assert sh("a touch a") == {"a": 0}
    assert len(made) == 3


def test_a_fork_closes_the_rulesets_kept(tmp_path):
    from sbxlimit import _landlock

    assert sh(f"a touch {tmp_path}/a", workdir=str(tmp_path)) == {"a": 0}
    kept = [fd for fd, _idents, _stats in _landlock._rulesets.values()]
    assert kept
    assert kept_in_a_fork(kept) == {}


@pytest.mark.parametrize("view", [False, True])
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"writable_roots": ["/var/tmp"], "deny_read": ["/var/tmp/x"]},
        {"deny_write": ["WS_PARENT"]},  # the workspace wholly denied: no rule for it
        {"deny_write": ["WS_PARENT/other"], "writable_roots": ["WS_PARENT"]},
    ],
)
def test_a_fresh_workspace_s_rules_are_those_of_its_path(tmp_path, extra, view):
    # A workspace made for the sandbox is resolved through its parent only
    # (_workspace.real_path); the rules must be those its path gives.
    from sbxlimit import _landlock

    home = tmp_path / "link"
    (tmp_path / "real").mkdir()
    (tmp_path / "real/other").mkdir()
    home.symlink_to(tmp_path / "real")  # workspaces made through a link
    ws = home / "sbxlimit-1-x"
    ws.mkdir()
    fixed = {k: [str(v).replace("WS_PARENT", str(home)) for v in vs] for k, vs in extra.items()}
    policy = Policy(**fixed)
    abi = _core.landlock_abi()
    made = _landlock.rules(policy, str(ws), abi, view=view, fresh=True)
    again = _landlock.rules(policy, str(ws), abi, view=view)
    # The same rules (Landlock's are a set: their order means nothing).
    assert made[0] == again[0] and dict(made[1]) == dict(again[1])
    assert len(made[1]) == len(again[1])


def test_kept_rules_never_hold_one_workspace_in_anothers():
    # The rules of a policy without denials are kept (_landlock._kept_rules);
    # a workspace made for one sandbox is added per call, never kept.
    from sbxlimit import _landlock

    abi = _core.landlock_abi()
    policy = Policy()
    first = dict(_landlock.rules(policy, "/tmp/sbxlimit-1-a", abi, view=True, fresh=True)[1])
    second = dict(_landlock.rules(policy, "/tmp/sbxlimit-2-b", abi, view=True, fresh=True)[1])
    assert "/tmp/sbxlimit-1-a" in first
    assert "/tmp/sbxlimit-2-b" in second and "/tmp/sbxlimit-1-a" not in second


@pytest.mark.parametrize("named", ["deny_write", "protected"])
def test_a_carving_is_made_again_at_each_spawn(tmp_path, named):
    # Carving lists a directory's entries: one that became a link since
    # must not keep its rule (a rule follows the link).  So carved rules are
    # never kept, whether the policy names the path or protect_dotfiles does.
    from sbxlimit import _landlock

    (tmp_path / "root/sub").mkdir(parents=True)
    (tmp_path / "root/denied").mkdir()
    (tmp_path / "elsewhere").mkdir()
    root, denied = str(tmp_path / "root"), str(tmp_path / "root/denied")
    kwargs = {"deny_write": [denied]} if named == "deny_write" else {}
    protected = [denied] if named == "protected" else []
    policy = Policy(writable_roots=[root], **kwargs)
    abi = _core.landlock_abi()
    before = dict(_landlock.rules(policy, None, abi, protected)[1])
    assert str(tmp_path / "root/sub") in before
    (tmp_path / "root/sub").rmdir()
    (tmp_path / "root/sub").symlink_to(tmp_path / "elsewhere")
    after = dict(_landlock.rules(policy, None, abi, protected)[1])
    assert str(tmp_path / "root/sub") not in after


def test_kept_rules_follow_a_re_pointed_writable_root_once_their_second_is_over(
    tmp_path, monkeypatch
):
    # A writable root named through a link is resolved again once the kept
    # resolution is older than _protected.TTL (as the view's binds are).
    from sbxlimit import _landlock

    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    link = tmp_path / "root"
    link.symlink_to(tmp_path / "one")
    policy = Policy(writable_roots=[str(link)])
    abi = _core.landlock_abi()
    assert str(tmp_path / "one") in dict(_landlock.rules(policy, None, abi, view=True)[1])
    link.unlink()
    link.symlink_to(tmp_path / "two")
    monkeypatch.setattr(_landlock, "TTL", 0.0)
    granted = dict(_landlock.rules(policy, None, abi, view=True)[1])
    assert str(tmp_path / "two") in granted and str(tmp_path / "one") not in granted
