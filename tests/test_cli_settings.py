"""The CLI as a new user meets it: every field a flag, where the program
runs, what it was given and from where, one JSON object whatever happens,
and defaults from a TOML file and SBXLIMIT_<FIELD> variables.

Each test runs the real CLI in a subprocess on real programs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import sbxlimit
from sbxlimit import _cli
from sbxlimit._settings import FIELDS, LIMIT_FIELDS, POLICY_FIELDS

from .cbuild import host_cc

PY = sys.executable
SCHEMAS = Path(sbxlimit.__file__).parent / "schemas"
RESULT_SCHEMA = json.loads((SCHEMAS / "run-result.schema.json").read_text())
MANIFEST_SCHEMA = json.loads((SCHEMAS / "manifest.schema.json").read_text())
# No config file or SBXLIMIT_<FIELD> of the machine running the tests.
CLEAN_ENV = {
    k: v
    for k, v in os.environ.items()
    if not (k.startswith("SBXLIMIT_") and k[9:].lower() in FIELDS)
}


def cli(*args: str, cwd: str | os.PathLike[str] | None = None, env=None, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 60)
    return subprocess.run(
        [PY, "-m", "sbxlimit", *args], cwd=cwd, env={**CLEAN_ENV, **(env or {})}, **kw
    )


def last_json(r: subprocess.CompletedProcess[str]) -> dict:
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    jsonschema.validate(doc, RESULT_SCHEMA)
    return doc


# -- 1. values no program starts with ------------------------------------------------


def test_a_memory_limit_without_a_unit_is_refused_with_the_unit_suggested():
    # It was exit 127 with nothing on stderr.
    r = cli("run", "--memory", "100", "--", "/bin/true")
    assert r.returncode == 2
    assert "too small for any program to start" in r.stderr
    assert "did you mean '100Mi'" in r.stderr


def test_a_program_the_loader_cannot_start_under_a_limit_is_said_to(tmp_path):
    # A library with 4 MiB of zero-fill pages: under RLIMIT_DATA of 1 MiB the
    # dynamic loader cannot map it and exits 127 before main().
    cc = host_cc()
    (tmp_path / "lib.c").write_text("char big[4 << 20];\nint f(void) { return big[0]; }\n")
    (tmp_path / "main.c").write_text("int f(void);\nint main(void) { return f(); }\n")
    lib = ["-shared", "-fPIC", "-o", str(tmp_path / "libbig.so"), str(tmp_path / "lib.c")]
    subprocess.run([*cc, *lib], check=True)
    main = [str(tmp_path / "main.c"), f"-L{tmp_path}", "-lbig", "-Wl,-rpath,$ORIGIN"]
    subprocess.run([*cc, "-o", str(tmp_path / "main"), *main], check=True)
    env = {"SBXLIMIT_CGROUP_PARENT": "none"}  # the memory limit is RLIMIT_DATA
    r = cli("run", "--memory", "1Mi", "--", str(tmp_path / "main"), env=env)
    assert r.returncode == 127
    assert "error while loading shared libraries" in r.stderr  # the loader's own words
    assert "note: 127 is also the dynamic loader's status" in r.stderr
    assert "memory (RLIMIT_DATA of 1.0 MiB)" in r.stderr
    # Room enough: it runs.
    assert cli("run", "--memory", "64Mi", "--", str(tmp_path / "main"), env=env).returncode == 0


def test_a_program_whose_image_does_not_fit_under_a_limit_is_said_to(tmp_path):
    # 64 MiB of zero-fill pages in a static binary: exec passes its point of
    # no return, then the kernel cannot map them under RLIMIT_DATA: SIGSEGV.
    (tmp_path / "big.c").write_text("char big[64 << 20];\nint main(void) { return big[0]; }\n")
    built = subprocess.run(
        [*host_cc(), "-static", "-o", str(tmp_path / "big"), str(tmp_path / "big.c")],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        pytest.skip(f"no static libc to link with: {built.stderr.strip()[-200:]}")
    env = {"SBXLIMIT_CGROUP_PARENT": "none"}
    r = cli("run", "--memory", "16Mi", "--", str(tmp_path / "big"), env=env)
    assert r.returncode == 128 + 11
    assert "note: The kernel also kills a program so when its image does not fit" in r.stderr
    assert "memory (RLIMIT_DATA of 16.0 MiB)" in r.stderr
    assert cli("run", "--memory", "128Mi", "--", str(tmp_path / "big"), env=env).returncode == 0


# -- 2. where the program runs, and what it was given ------------------------------


def test_a_policy_run_starts_where_the_cli_was_started(tmp_path):
    # `--deny-network -- python3 script.py` could not find script.py: the
    # program ran in its private workspace.
    (tmp_path / "script.py").write_text("import os; print('ran in', os.getcwd())")
    r = cli("run", "--deny-network", "--", PY, "script.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"ran in {tmp_path}"


def test_the_start_directory_is_read_only_and_the_cli_says_so(tmp_path):
    r = cli("run", "--deny-network", "--", "sh", "-c", "echo x > out", cwd=tmp_path)
    assert r.returncode != 0 and not (tmp_path / "out").exists()
    assert "read-only in the sandbox" in r.stderr and f"--workdir {tmp_path}" in r.stderr


def test_workdir_makes_a_directory_the_writable_workspace(tmp_path):
    r = cli(
        "run", "--deny-network", "--workdir", ".", "--", "sh", "-c", "echo x > out", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out").read_text() == "x\n"


def test_cwd_chooses_where_it_starts(tmp_path):
    (tmp_path / "sub").mkdir()
    r = cli("run", "--deny-network", "--cwd", "sub", "--", "pwd", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "sub")
    r = cli("run", "--cwd", "nowhere", "--", "pwd", cwd=tmp_path)
    assert r.returncode == 2 and "--cwd nowhere: not a directory" in r.stderr


def test_explain_says_what_a_manifest_implies_and_where_each_value_came_from(tmp_path):
    # A manifest that sets only memory also limits cpu, disk and wall_time.
    (tmp_path / "m.json").write_text('{"resources": {"memory": "128Mi"}}')
    r = cli(
        "run",
        "--manifest",
        "m.json",
        "--pids",
        "32",
        "--explain",
        "--",
        "sbx-never-run",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    settings = r.stdout.split("held by")[0]
    lines = {line.split()[0]: line for line in settings.splitlines() if line.startswith("  ")}
    assert "128 MiB" in lines["memory"] and lines["memory"].endswith("--manifest")
    for field in ("cpu", "disk", "wall_time"):
        assert lines[field].endswith("--manifest (default)"), lines[field]
    assert lines["pids"].endswith("--pids")
    assert "held by (on this machine):" in r.stdout


def test_a_limit_a_manifest_implied_says_so_when_it_ends_the_run(tmp_path):
    # Only memory is set; the SPEC's default disk of 100Mi still holds.
    (tmp_path / "m.json").write_text('{"resources": {"memory": "512Mi"}}')
    fill = 'head -c 120M /dev/zero > "$TMPDIR/fill"; sleep 5'
    r = cli("run", "--manifest", "m.json", "--", "sh", "-c", fill, cwd=tmp_path)
    assert r.returncode == 124, r.stderr
    assert "the manifest does not set disk: this is SPEC section 2's default" in r.stderr


def test_json_holds_the_effective_settings_and_their_sources(tmp_path):
    (tmp_path / "m.json").write_text('{"resources": {"memory": "128Mi"}}')
    r = cli("run", "--manifest", "m.json", "--json", "--", "true", cwd=tmp_path)
    doc = last_json(r)
    assert doc["version"] == 1 and doc["error"] is None
    assert doc["limits"]["memory"] == 128 << 20 and doc["limits"]["wall_time"] == 15
    assert doc["sources"]["wall_time"] == "--manifest (default)"
    assert doc["sources"]["memory"] == "--manifest"


# -- 3. every field a flag; the CLI validates what the API does -------------------


def _dests(parser_action_owner) -> set[str]:
    sub = next(a for a in _cli._parser()._actions if a.dest == "command")
    return {a.dest for a in sub.choices["run"]._actions}  # type: ignore[attr-defined]


def test_every_limits_and_policy_field_has_a_flag():
    dests = _dests(None)
    assert set(LIMIT_FIELDS) | set(POLICY_FIELDS) <= dests
    assert set(_cli._FLAGS) == set(FIELDS)  # one table, no field left out or made up


def test_flags_that_only_the_api_had_work_for_real(tmp_path):
    code = "import os; print(sorted(k for k in os.environ if k.startswith('SBX_')), os.getpid())"
    r = cli(
        "run",
        "--env",
        "PATH,SBX_A,SBX_TOKEN",
        "--drop-secrets",
        "--isolate-pids",
        "--keep-workdir",
        "--no-protect-dotfiles",
        "--json",
        "--",
        PY,
        "-c",
        code,
        env={"SBX_A": "1", "SBX_B": "2", "SBX_TOKEN": "t"},
    )
    assert r.returncode == 0, r.stderr
    names, pid = r.stdout.splitlines()[0].rsplit(" ", 1)
    assert names == "['SBX_A']"  # B not listed, TOKEN dropped as a secret
    doc = last_json(r)
    assert os.path.isdir(doc["workspace"])  # kept
    shutil.rmtree(doc["workspace"])
    assert doc["policy"]["keep_workdir"] is True and doc["policy"]["protect_dotfiles"] is False
    assert doc["policy"]["isolate_pids"] is True
    if not doc["enforced"].get("pids_isolation", "").startswith("unenforced"):
        assert int(pid) <= 2  # PID 1 is the reaper or the program itself


def test_a_relative_rule_path_is_refused_with_the_absolute_one(tmp_path):
    r = cli("run", "--writable", "out", "--", "true", cwd=tmp_path)
    assert r.returncode == 2
    assert f"--writable out: a relative path: give it absolute ({tmp_path}/out" in r.stderr


def test_a_missing_writable_path_is_refused_and_a_missing_deny_path_warned(tmp_path):
    r = cli("run", "--writable", str(tmp_path / "no"), "--", "true")
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = cli("run", "--deny-read", str(tmp_path / "typo"), "--", "true")
    assert r.returncode == 0
    assert f"warning: --deny-read {tmp_path / 'typo'}: does not exist" in r.stderr


@pytest.mark.parametrize(
    ("args", "status", "kind"),
    [
        (["--memory", "lots", "--", "true"], 2, "usage"),
        (["--bogus", "--", "true"], 2, "usage"),
        (["--", "sbx-no-such-cmd"], 127, "not_found"),
        (["--", "/"], 126, "not_executable"),
    ],
)
def test_json_is_one_object_even_when_nothing_ran(args, status, kind, tmp_path):
    r = cli("run", "--json", *args)
    assert r.returncode == status
    doc = last_json(r)
    assert doc["exit_status"] == status and doc["error"]["kind"] == kind
    out = tmp_path / "r.json"
    r = cli("run", f"--json={out}", *args)
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, RESULT_SCHEMA)
    assert doc["error"]["kind"] == kind


def test_json_for_a_strict_refusal():
    env = {"SBXLIMIT_CGROUP_PARENT": "none"}  # no cgroup: a CPU rate has no mechanism
    r = cli("run", "--cpu", "500m", "--strict", "--json", "--", "true", env=env)
    assert r.returncode == 125
    assert last_json(r)["error"]["kind"] == "unsupported"
    # The hint speaks the CLI's language, not the API's (it said "pass strict=False").
    assert "without --strict" in r.stderr and "strict=False" not in r.stderr


def test_version():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"sbxlimit {sbxlimit.__version__}"


# -- 6. names ----------------------------------------------------------------------------


def test_wall_time_is_the_flag_and_timeout_its_old_name():
    r = cli("run", "--wall-time", "300ms", "--kill-grace", "0", "--json", "--", "sleep", "10")
    assert r.returncode == 124 and last_json(r)["termination"]["reason"] == "wall_time"
    r = cli("run", "--timeout", "300ms", "--kill-grace", "0", "--", "sleep", "10")
    assert r.returncode == 124 and "--timeout is now --wall-time" in r.stderr
    r = cli("run", "--timeout", "1s", "--wall-time", "2s", "--", "true")
    assert r.returncode == 2 and "give one" in r.stderr


# -- 7. defaults from a file and the environment ----------------------------------------


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o644)
    return path


def test_sbxlimit_toml_in_a_parent_directory_gives_defaults(tmp_path):
    _write(tmp_path / "sbxlimit.toml", 'memory = "64Mi"\nnetwork = "deny"\n')
    (tmp_path / "deep" / "er").mkdir(parents=True)
    r = cli("run", "--json", "--", "true", cwd=tmp_path / "deep" / "er")
    doc = last_json(r)
    assert doc["limits"]["memory"] == 64 << 20 and doc["policy"]["network"] == "deny"
    assert doc["sources"]["memory"] == str(tmp_path / "sbxlimit.toml")
    assert "network" in doc["enforced"]


def test_pyproject_tool_table_and_precedence(tmp_path):
    _write(tmp_path / "pyproject.toml", '[tool.sbxlimit]\nmemory = "64Mi"\npids = 16\n')
    env = {"SBXLIMIT_MEMORY": "96Mi", "SBXLIMIT_WALL_TIME": "20s"}
    r = cli("run", "--pids", "8", "--json", "--", "true", cwd=tmp_path, env=env)
    doc = last_json(r)
    # file < environment < flags, field by field
    assert doc["limits"]["memory"] == 96 << 20 and doc["sources"]["memory"] == "SBXLIMIT_MEMORY"
    assert doc["limits"]["pids"] == 8 and doc["sources"]["pids"] == "--pids"
    assert doc["limits"]["wall_time"] == 20
    r = cli("run", "--no-config", "--json", "--", "true", cwd=tmp_path, env=env)
    assert last_json(r)["limits"] is None


def test_a_pyproject_without_the_table_is_passed_over(tmp_path):
    _write(tmp_path / "sbxlimit.toml", "pids = 16\n")
    (tmp_path / "proj").mkdir()
    _write(tmp_path / "proj" / "pyproject.toml", '[project]\nname = "x"\n')
    doc = last_json(cli("run", "--json", "--", "true", cwd=tmp_path / "proj"))
    assert doc["limits"]["pids"] == 16


def test_a_config_file_limit_is_enforced(tmp_path):
    _write(tmp_path / "sbxlimit.toml", 'wall_time = "300ms"\nkill_grace = 0\n')
    r = cli("run", "--", "sleep", "10", cwd=tmp_path)
    assert r.returncode == 124 and "wall" in r.stderr


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('memroy = "1Gi"\n', "unknown field 'memroy'; did you mean 'memory'?"),
        ('memory = "lots"\n', "Limits.memory: not a size"),
        ("memory = \n", "not valid TOML"),
    ],
)
def test_a_bad_config_file_names_itself(tmp_path, text, needle):
    f = _write(tmp_path / "sbxlimit.toml", text)
    r = cli("run", "--json", "--", "true", cwd=tmp_path)
    assert r.returncode == 2 and str(f) in r.stderr and needle in r.stderr
    assert last_json(r)["error"]["kind"] == "usage"


def test_a_program_cannot_leave_a_config_file_that_frees_its_next_run(tmp_path):
    # Run 1 may write where it runs (--workdir .) and leaves a config file
    # that would make the home directory writable and drop the hardening.
    evil = 'writable_roots = ["/"]\nharden = false\n'
    r = cli(
        "run", "--workdir", ".", "--", "sh", "-c", f"printf '{evil}' > sbxlimit.toml", cwd=tmp_path
    )
    assert r.returncode == 0 and (tmp_path / "sbxlimit.toml").exists()
    (tmp_path / "sbxlimit.toml").chmod(0o644)
    # Run 2, the same command line, refuses to start instead of running freed.
    r = cli("run", "--workdir", ".", "--json", "--", "true", cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert "may only tighten" in r.stderr and str(tmp_path / "sbxlimit.toml") in r.stderr
    # Named on purpose, it is trusted.
    r = cli("run", "--config", "sbxlimit.toml", "--json", "--", "true", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert last_json(r)["policy"]["writable_roots"] == ["/"]


def test_a_config_file_that_tightens_is_read_when_found(tmp_path):
    _write(tmp_path / "sbxlimit.toml", 'harden = true\nisolate_pids = true\ndeny_read = ["/etc"]\n')
    doc = last_json(cli("run", "--json", "--", "true", cwd=tmp_path))
    assert doc["policy"]["deny_read"] == ["/etc"] and doc["policy"]["isolate_pids"] is True


def test_a_config_file_others_may_write_is_refused(tmp_path):
    f = _write(tmp_path / "sbxlimit.toml", 'network = "allow"\n')
    f.chmod(0o666)
    r = cli("run", "--", "true", cwd=tmp_path)
    assert r.returncode == 2 and "writable by others than its owner" in r.stderr


def test_a_bad_environment_value_names_its_variable():
    r = cli("run", "--", "true", env={"SBXLIMIT_MEMORY": "lots"})
    assert r.returncode == 2 and "environment variable SBXLIMIT_MEMORY" in r.stderr


def test_config_flag_and_load_config(tmp_path):
    f = _write(tmp_path / "limits.toml", 'memory = "64Mi"\nnetwork = "deny"\n')
    doc = last_json(cli("run", "--config", str(f), "--json", "--", "true"))
    assert doc["limits"]["memory"] == 64 << 20
    cfg = sbxlimit.load_config(f, environ={"SBXLIMIT_PIDS": "9", "SBXLIMIT_DEFAULTS": "x"})
    assert cfg.limits == sbxlimit.Limits(memory="64Mi", pids=9)
    assert cfg.policy == sbxlimit.Policy(network="deny")
    assert cfg.sources == {"memory": str(f), "network": str(f), "pids": "SBXLIMIT_PIDS"}


# -- the schemas -------------------------------------------------------------------------


def test_the_result_schema_names_every_field_and_reason():
    props = RESULT_SCHEMA["properties"]
    assert set(props["limits"]["oneOf"][1]["properties"]) == set(LIMIT_FIELDS)
    assert set(props["policy"]["oneOf"][1]["properties"]) == set(POLICY_FIELDS)
    assert tuple(props["termination"]["properties"]["reason"]["enum"]) == sbxlimit.REASONS


@pytest.mark.parametrize(
    ("manifest", "valid"),
    [
        ({}, True),
        ({"resources": {"memory": {"limit": "512Mi", "request": "256Mi"}, "cpu": "500m"}}, True),
        ({"execution_limits": {"max_tool_call_duration": "30s", "rate_limit": "5/minute"}}, True),
        ({"resources": {"memroy": "1Gi"}}, False),
        ({"resources": {"memory": {"limit": "1Gi", "max": 2}}}, False),
        ({"execution_limits": {"rate_limit": "5 per minute"}}, False),
        ({"limits": {}}, False),
    ],
)
def test_the_manifest_schema_agrees_with_the_reader(manifest, valid):
    ok = jsonschema.Draft202012Validator(MANIFEST_SCHEMA).is_valid(manifest)
    assert ok == valid
    try:
        sbxlimit.Limits.from_manifest(manifest)
        read = True
    except sbxlimit.ConfigError:
        read = False
    assert read == valid
