"""File rules held exactly by the read-only view (and Landlock on top where
the kernel has it): writable roots are writable, new files included;
protected paths at any depth refuse every change; git works in a writable
repository.  Real programs, real git; as root and unprivileged, natively
and in the UML guest (no Landlock there: the view alone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import sbxlimit
from sbxlimit import Policy
from sbxlimit._namespaces import CLONE_NEWNS, namespaces

from .conftest import why_not

LINUX = sys.platform.startswith("linux")
VIEW = namespaces(CLONE_NEWNS, view=True) if LINUX else None
pytestmark = pytest.mark.skipif(
    not (VIEW and VIEW.ok),
    reason=f"doctor: read_only_view unavailable: {VIEW.reason if VIEW else 'not Linux'}",
)
PY = sys.executable
GIT = shutil.which("git")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def sh(script: str, policy: Policy, **kw) -> dict[str, int]:
    """Run `script` (lines `NAME command`); each command's exit status."""
    lines = [ln.strip().split(" ", 1) for ln in script.splitlines() if ln.strip()]
    body = "\n".join(f"{cmd} >/dev/null 2>&1; echo {name}=$?" for name, cmd in lines)
    r = sbxlimit.run(["sh", "-c", body], policy=policy, capture_output=True, text=True, **kw)
    assert r.returncode == 0, r.stderr
    return {k: int(v) for k, v in (ln.split("=") for ln in r.stdout.split())}


def state(path) -> dict[str, object]:
    """Everything a change could touch, for every file under path."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            data = None
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    data = f.read()
            out[os.path.relpath(p, path)] = (st.st_mode, st.st_uid, st.st_mtime_ns, data)
    return out


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A HOME with dotfiles, a repository at depth 1 and one at depth 3."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    (h / ".ssh" / "authorized_keys").write_text("key\n")
    (h / ".bashrc").write_text("# rc\n")
    (h / "notes.txt").write_text("n\n")
    env = {**os.environ, **GIT_ENV}
    for repo in ("proj", "a/b/deep"):
        (h / repo).mkdir(parents=True)
        subprocess.run([GIT, "init", "-q", str(h / repo)], check=True, env=env)
        (h / repo / "code.py").write_text("print(1)\n")
    monkeypatch.setenv("HOME", str(h))
    return h


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_a_writable_home_is_writable_and_its_dotfiles_and_repositories_are_not(home, view_made):
    protected = {
        p: state(home / p) | {"": os.stat(home / p).st_mode}
        for p in (".ssh", "proj/.git/hooks", "a/b/deep/.git/hooks")
    }
    configs = {p: (home / p).read_bytes() for p in ("proj/.git/config", "a/b/deep/.git/config")}
    bashrc = (home / ".bashrc").read_bytes()
    attacks = ""
    for n, repo in enumerate(("proj", "a/b/deep")):
        g = home / repo / ".git"
        attacks += f"""
        hook{n} sh -c 'echo evil > {g}/hooks/pre-commit'
        hook_chmod{n} chmod 777 {g}/hooks
        hook_rename{n} mv {g}/hooks {g}/hooks.old
        config_append{n} sh -c 'echo "[core] hooksPath=/tmp" >> {g}/config'
        config_truncate{n} truncate -s 0 {g}/config
        config_replace{n} sh -c 'echo x > {g}/c2 && mv {g}/c2 {g}/config'
        config_unlink{n} rm -f {g}/config
        config_chmod{n} chmod 666 {g}/config
        """
    r = sh(
        f"""
        new_file sh -c 'echo ok > {home}/new.txt'
        new_dir mkdir {home}/newdir
        notes sh -c 'echo more >> {home}/notes.txt'
        code sh -c 'echo "print(2)" > {home}/a/b/deep/code.py'
        bashrc sh -c 'echo evil >> {home}/.bashrc'
        bashrc_unlink rm -f {home}/.bashrc
        bashrc_replace sh -c 'echo evil > {home}/b2 && mv {home}/b2 {home}/.bashrc'
        ssh_key sh -c 'echo evil >> {home}/.ssh/authorized_keys'
        ssh_new touch {home}/.ssh/new_key
        {attacks}
        """,
        Policy(writable_roots=[str(home)]),
    )
    made = {k: v for k, v in r.items() if k in ("new_file", "new_dir", "notes", "code")}
    assert made == {"new_file": 0, "new_dir": 0, "notes": 0, "code": 0}, r
    refused = {k: v for k, v in r.items() if k not in made}
    assert all(v != 0 for v in refused.values()), {k: v for k, v in refused.items() if v == 0}
    assert (home / ".bashrc").read_bytes() == bashrc
    for p, before in protected.items():
        assert state(home / p) | {"": os.stat(home / p).st_mode} == before, p
    for p, data in configs.items():
        assert (home / p).read_bytes() == data, p


def linked_home(tmp_path, monkeypatch):
    """A HOME whose dotfiles are links into a dotfiles repository beside it
    (as dotfile managers make them): ~/.zshrc and ~/.gitconfig link to
    files, ~/.ssh to a directory."""
    h = tmp_path / "home"
    dots = tmp_path / "dotfiles"
    (dots / "ssh").mkdir(parents=True)
    (h / "work").mkdir(parents=True)
    (dots / "zshrc").write_text("# rc\n")
    (dots / "gitconfig").write_text("[user]\n")
    (h / ".zshrc").symlink_to(dots / "zshrc")
    (h / ".gitconfig").symlink_to("../dotfiles/gitconfig")  # relative
    (h / ".ssh").symlink_to(dots / "ssh")
    monkeypatch.setenv("HOME", str(h))
    return h


# Both trees writable: the links' targets are protected where they are.
LINK_ATTACKS = """
    new_file sh -c 'echo ok > {h}/work/new.txt'
    through sh -c 'echo evil >> {h}/.zshrc'
    target sh -c 'echo evil >> {h}/../dotfiles/zshrc'
    unlink rm -f {h}/.zshrc
    replace sh -c 'echo evil > {h}/z2 && mv -f {h}/z2 {h}/.zshrc'
    relink ln -sfn {h}/work/new.txt {h}/.gitconfig
    rename mv {h}/.gitconfig {h}/g2
"""


def link_roots(h) -> list[str]:
    return [str(h), str(h.parent / "dotfiles")]


def check_link_attacks(h, r: dict[str, int]) -> None:
    assert r.pop("new_file") == 0
    assert [k for k, v in r.items() if v == 0] == []
    assert os.readlink(h / ".zshrc") == str(h.parent / "dotfiles" / "zshrc")
    assert os.readlink(h / ".gitconfig") == "../dotfiles/gitconfig"
    assert (h / ".zshrc").read_text() == "# rc\n"


def test_a_dotfile_that_is_a_link_is_protected_as_link_and_target(tmp_path, monkeypatch):
    # The link's target is bound over the link itself: writes through it,
    # and replacing it with a file of the program's, are refused.
    h = linked_home(tmp_path, monkeypatch)
    policy = Policy(writable_roots=link_roots(h))
    with sbxlimit.Popen(["true"], policy=policy) as p:
        note = p.enforced["protect_dotfiles"]
    check_link_attacks(h, sh(LINK_ATTACKS.format(h=h), policy))
    # A directory cannot be mounted over a link: said, not hidden.
    assert "a link to a directory, so it can be replaced: ~/.ssh" in note


GIT_SCRIPT = """
set -e
cd "$1"
echo "print(3)" > more.py
git add -A
git commit -qm "from the sandbox"
git branch feature
git checkout -q feature
git gc -q
git log --oneline | wc -l
if echo evil > .git/hooks/pre-commit 2>/dev/null; then echo hook-written; fi
if git config user.name evil 2>/dev/null; then echo config-written; fi
"""


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_git_works_in_a_writable_repository_but_not_on_its_hooks_and_config(home):
    repo = home / "a" / "b" / "deep"
    subprocess.run([GIT, "-C", str(repo), "add", "-A"], check=True, env={**os.environ, **GIT_ENV})
    subprocess.run(
        [GIT, "-C", str(repo), "commit", "-qm", "first"], check=True, env={**os.environ, **GIT_ENV}
    )
    config = (repo / ".git" / "config").read_bytes()
    r = sbxlimit.run(
        ["sh", "-c", GIT_SCRIPT, "sh", str(repo)],
        policy=Policy(writable_roots=[str(home)]),
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2"], (r.stdout, r.stderr)
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert (repo / ".git" / "config").read_bytes() == config
    log = subprocess.run(
        [GIT, "-C", str(repo), "log", "--format=%s", "feature"], capture_output=True, text=True
    )
    assert log.stdout.split("\n")[0] == "from the sandbox"


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_a_worktrees_gitdir_is_followed(home, tmp_path):
    repo = home / "proj"
    env = {**os.environ, **GIT_ENV}
    subprocess.run([GIT, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "x"], env=env)
    wt = home / "wt"
    subprocess.run([GIT, "-C", str(repo), "worktree", "add", "-q", str(wt)], check=True, env=env)
    r = sh(
        f"""
        hook sh -c 'echo evil > {repo}/.git/hooks/post-checkout'
        via_worktree sh -c 'cd {wt} && echo evil > "$(git rev-parse --git-common-dir)/hooks/x"'
        worktree_file sh -c 'echo ok > {wt}/file.txt'
        """,
        Policy(writable_roots=[str(home)]),
        env=env,
    )
    assert r["hook"] != 0 and r["via_worktree"] != 0 and r["worktree_file"] == 0, r


def test_links_and_proc_self_root_do_not_get_around_the_rules(home, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n")
    os.symlink(outside, home / "link-out")
    os.symlink(home / ".bashrc", home / "link-rc")
    r = sh(
        f"""
        via_link sh -c 'echo x >> {home}/link-out'
        via_link_rc sh -c 'echo x >> {home}/link-rc'
        via_proc sh -c 'echo x >> /proc/self/root{outside}'
        via_proc_rc sh -c 'echo x >> /proc/self/root{home}/.bashrc'
        via_cwd sh -c 'cd / && echo x >> .{outside}'
        hardlink ln {outside} {home}/hard
        """,
        Policy(writable_roots=[str(home)]),
    )
    assert all(v != 0 for v in r.values()), r
    assert outside.read_text() == "keep\n" and (home / ".bashrc").read_text() == "# rc\n"


def test_deny_read_hides_contents_and_names(tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("k")
    (tmp_path / "token").write_text("t")
    code = (
        "import json, os, sys\n"
        "out = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        out[p] = os.listdir(p) if os.path.isdir(p) else open(p).read()\n"
        "    except OSError as e:\n"
        "        out[p] = e.errno\n"
        "print(json.dumps(out))"
    )
    paths = [str(secret), str(secret / "key"), str(tmp_path / "token")]
    r = sbxlimit.run(
        [PY, "-c", code, *paths],
        policy=Policy(deny_read=[str(secret), str(tmp_path / "token")]),
        capture_output=True,
        text=True,
    )
    got = json.loads(r.stdout)
    # Covered (the view) and, where Landlock is there too, unreadable.
    assert got[str(secret)] in ([], 13) and got[str(tmp_path / "token")] in ("", 13)
    assert isinstance(got[str(secret / "key")], int)


def test_nothing_mounted_is_left_on_the_host(home):
    with open("/proc/self/mountinfo") as f:
        before = f.read()
    sbxlimit.run(["true"], policy=Policy(writable_roots=[str(home)], deny_read=[str(home / "a")]))
    with open("/proc/self/mountinfo") as f:
        assert f.read() == before


def test_a_dotfile_made_between_two_spawns_is_protected_in_the_second(tmp_path, monkeypatch):
    # The protected paths' resolution is reused for a second (spawns come
    # in bursts); whether each exists is not: a ~/.zshrc made just after
    # one sandbox is read-only in the next.
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    policy = Policy(writable_roots=[str(home)])
    zshrc = home / ".zshrc"
    assert sh(f"write touch {home}/notes", policy) == {"write": 0}
    zshrc.write_text("# the user's own\n")
    second = sh(f"write sh -c 'echo evil >> {zshrc}'", policy)
    assert second["write"] != 0
    assert zshrc.read_text() == "# the user's own\n"


def test_dotfiles_that_do_not_exist_yet_are_named(home):
    r = sbxlimit.run(["true"], policy=Policy(writable_roots=[str(home)]))
    note = r.enforced["protect_dotfiles"]
    missing = (
        "~/.bash_login, ~/.bash_profile, ~/.profile, ~/.zlogin, ~/.zprofile, ~/.zshenv, "
        "~/.zshrc, ~/.gitconfig, ~/.config/git/config"
    )
    assert f"not there, so a new one can be made: {missing}" in note
    assert "~/.bashrc" not in note and "~/.ssh" not in note
    r = sbxlimit.run(["true"], policy=Policy(writable_roots=[str(home / "proj")]))
    assert "not there" not in r.enforced["protect_dotfiles"]


def test_a_dotfile_s_note_follows_a_new_search(home, monkeypatch):
    # The notes are reused with the search they came from (the same
    # request, the same search); a new search says what is there now.
    from sbxlimit import _protected

    policy = Policy(writable_roots=[str(home)])
    first = sbxlimit.run(["true"], policy=policy).enforced["protect_dotfiles"]
    assert "~/.zshrc" in first
    (home / ".zshrc").write_text("# the user's own\n")
    monkeypatch.setattr(_protected, "TTL", 0.0)  # each spawn searches again
    second = sbxlimit.run(["true"], policy=policy).enforced["protect_dotfiles"]
    assert "not there" in second and "~/.zshrc" not in second


def test_enforced_names_the_view():
    r = sbxlimit.run(["true"], policy=Policy())
    label = "userns+mountns:ro-view" if VIEW and VIEW.user else "mountns:ro-view"
    assert r.enforced["files"].startswith(label)
    assert r.enforced["protect_dotfiles"].startswith(f"{label} (bound read-only:")


def test_what_the_policy_names_is_resolved_at_every_spawn(tmp_path):
    # The view of a workdir is reused from one spawn to the next, but not
    # deny_write and deny_read: a link retargeted, or a path made, between
    # two spawns is held in the second at once.
    for name in ("a", "b"):
        (tmp_path / name).write_text(name)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    pol = Policy(
        workdir=str(tmp_path),
        deny_write=[str(tmp_path / "link")],
        deny_read=[str(tmp_path / "later")],
    )
    write = f"a sh -c 'echo x >> {tmp_path}/a'\nb sh -c 'echo x >> {tmp_path}/b'"
    refused = {k: v != 0 for k, v in sh(write, pol).items()}
    assert refused == {"a": True, "b": False}
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to(tmp_path / "b")
    (tmp_path / "later").write_text("secret")
    refused = {
        k: v != 0 for k, v in sh(f"{write}\nlater grep -q secret {tmp_path}/later", pol).items()
    }
    assert refused == {"a": False, "b": True, "later": True}


NO_LANDLOCK = not LINUX or sbxlimit._core.landlock_abi() < 1


@pytest.mark.skipif(NO_LANDLOCK, reason=why_not("landlock") if NO_LANDLOCK else "")
def test_a_sandbox_s_private_tmpfs_is_not_granted_to_the_next(tmp_path):
    # Each sandbox gets a /dev/shm of its own, and a Landlock rule for it
    # added in the child.  A workdir's ruleset is reused from one spawn to
    # the next: had that rule gone into it, every later sandbox of the
    # same policy would hold it (and the ruleset would grow a rule a spawn
    # for good).  Handed a live sandbox's /dev/shm, the next may not write.
    work = tmp_path / "work"
    work.mkdir()
    pol = Policy(workdir=str(work))
    make = "import os, sys; os.close(os.open('x', os.O_CREAT | os.O_WRONLY, 0o600, dir_fd={}))"
    first = sbxlimit.Popen(
        [PY, "-c", make.format("os.open('/dev/shm', os.O_RDONLY)") + "; sys.stdin.read()"],
        policy=pol,
        stdin=subprocess.PIPE,
    )
    try:
        shm = f"/proc/{first.pid}/root/dev/shm"
        for _ in range(500):  # until its own file is there: it may write
            if os.path.exists(f"{shm}/x"):
                break
            assert first.poll() is None
            time.sleep(0.01)
        fd = os.open(shm, os.O_RDONLY | os.O_DIRECTORY)
        try:
            second = sbxlimit.run(
                [PY, "-c", make.format(fd).replace("'x'", "'from-the-next'")],
                policy=pol,
                pass_fds=[fd],
                capture_output=True,
                text=True,
            )
        finally:
            os.close(fd)
        assert "PermissionError" in second.stderr, second.stderr
        assert not os.path.exists(f"{shm}/from-the-next")
    finally:
        first.communicate(b"")
    assert first.returncode == 0


MEANWHILE = """
import json, os, sys
print("ready", flush=True)
sys.stdin.readline()  # the host has mounted meanwhile
out = {}
for name, change in (
    ("chmod", lambda p: os.chmod(p, 0o777)),
    ("utime", lambda p: os.utime(p, (0, 0))),
    ("setxattr", lambda p: os.setxattr(p, "user.sbx", b"1")),
    ("write", lambda p: open(p, "a").write("x")),
):
    try:
        change(sys.argv[1])
        out[name] = "ok"
    except OSError as e:
        out[name] = e.strerror
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting on the host takes root")
def test_a_mount_the_host_makes_meanwhile_does_not_come_in_writable(tmp_path):
    # systemd makes "/" shared: a volume or a login's /run/user mounted on
    # the host while a sandbox runs would come into its view with its own
    # flags.  Modelled with a shared mount of our own.
    shared, src = tmp_path / "shared", tmp_path / "src"
    (shared / "mnt").mkdir(parents=True)
    src.mkdir()
    victim = src / "victim"
    victim.write_text("precious")
    os.utime(victim, (1_000_000, 1_000_000))
    before = state(src)
    subprocess.run(["mount", "--bind", shared, shared], check=True)
    try:
        subprocess.run(["mount", "--make-shared", shared], check=True)
        with sbxlimit.Popen(
            [PY, "-c", MEANWHILE, str(shared / "mnt" / "victim")],
            policy=Policy(protect_dotfiles=False),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as p:
            assert p.stdout.readline() == "ready\n"
            subprocess.run(["mount", "--bind", src, shared / "mnt"], check=True)
            out, _ = p.communicate("go\n", timeout=30)
        got = json.loads(out)
    finally:
        subprocess.run(["umount", "-R", shared], check=False)
    assert "ok" not in got.values(), got
    assert state(src) == before


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_what_the_view_covers_cannot_be_moved_away_through_a_directory_above_it(home):
    # Each protected path is a mount point; the directories on the way to
    # it from the writable root are not, unless the view makes them so:
    # renamed away with the bound file beneath, they would leave the name
    # free for the program's own .git, ~/.config/git/config or secret.
    (home / ".config" / "git").mkdir(parents=True)
    (home / ".config" / "git" / "config").write_text("[user]\n")
    g = home / "a" / "b" / "deep" / ".git"
    before = state(home)
    r = sh(
        f"""
        dotgit mv {home}/proj/.git {home}/proj/.git.old
        dotgit_over sh -c 'mkdir -p {home}/x/hooks && mv -T {home}/x {home}/proj/.git'
        gitdir_file sh -c 'echo gitdir: /tmp > {home}/f && mv -T {home}/f {home}/proj/.git'
        repo mv {home}/proj {home}/proj2
        deep_parent mv {home}/a {home}/a2
        deep_dotgit mv {g} {g}.old
        config_dir mv {home}/.config {home}/.config.old
        config_git mv {home}/.config/git {home}/.config/git.old
        """,
        Policy(writable_roots=[str(home)]),
    )
    assert all(v != 0 for v in r.values()), {k: v for k, v in r.items() if v == 0}
    shutil.rmtree(home / "x")
    os.unlink(home / "f")
    assert state(home) == before


def test_a_denied_path_and_a_nested_writable_root_keep_their_place(tmp_path):
    # Renaming a parent would move the hidden secret (or the nested root's
    # mount) aside; the next spawn, resolving the same names again, would
    # then find the secret elsewhere, or follow a link planted in its place.
    proj = tmp_path / "proj"
    (proj / "config").mkdir(parents=True)
    (proj / "config" / "secrets.env").write_text("API_KEY=1\n")
    (proj / "build" / "out").mkdir(parents=True)
    policy = Policy(
        workdir=str(proj),
        writable_roots=[str(proj / "build" / "out")],
        deny_read=[str(proj / "config" / "secrets.env")],
        protect_dotfiles=False,
    )
    before = state(proj)
    r = sh(
        f"""
        secret_parent mv {proj}/config {proj}/config.d
        root_parent mv {proj}/build {proj}/build.old
        root_link sh -c 'rm -rf {proj}/build && ln -s /tmp {proj}/build'
        """,
        policy,
    )
    assert all(v != 0 for v in r.values()), {k: v for k, v in r.items() if v == 0}
    assert state(proj) == before
    # And everything else in the root is as writable as before.
    ok = sh(f"new mkdir {proj}/config/more\nmove mv {proj}/config/more {proj}/more", policy)
    assert ok == {"new": 0, "move": 0}


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_a_repository_made_just_before_a_spawn_is_protected_in_it(home):
    # The search of the same roots is reused from one spawn to the next,
    # but not past a change in the tree: the caller's `git init` is seen.
    policy = Policy(writable_roots=[str(home)])
    assert sh("first true", policy) == {"first": 0}
    new = home / "fresh"
    subprocess.run([GIT, "init", "-q", str(new)], check=True, env={**os.environ, **GIT_ENV})
    config = (new / ".git" / "config").read_bytes()
    r = sh(
        f"""
        config sh -c 'echo "[core] fsmonitor = evil" >> {new}/.git/config'
        hook sh -c 'echo evil > {new}/.git/hooks/pre-commit'
        """,
        policy,
    )
    assert all(v != 0 for v in r.values()), r
    assert (new / ".git" / "config").read_bytes() == config
    assert not (new / ".git" / "hooks" / "pre-commit").exists()
