"""Declares the C extension only; metadata lives in pyproject.toml.

Build switches (environment variables):
  SBXLIMIT_DEBUG=1     -O0 -g -fsanitize=address,undefined (the core; .ci/sanitize
                       runs the tests under it); the child is fork()ed
                       instead of vfork()ed, since sanitizers cannot follow
                       a CLONE_VM child.  Run with
                       LD_PRELOAD="$(gcc -print-file-name=libasan.so)".
  SBXLIMIT_NO_WERROR=1 do not turn warnings into errors (for unknown compilers).
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

COMMON = [
    "csrc/_coremodule.c",
    "csrc/spawn.c",
    "csrc/child_fail.c",
    "csrc/rlimit.c",
    "csrc/fds.c",
    "csrc/probe.c",
    "csrc/fsbatch.c",
    "csrc/darwin/seatbelt.c",  # plain C: built (and testable) everywhere
]


def sources(platform: str) -> list[str]:
    """The core's C files for `platform` (a sys.platform value); the macOS
    cross-compile test (tests/test_cross_build.py) uses the same list."""
    if platform.startswith("linux"):
        linux = [
            "proctree.c",
            "cgroup.c",
            "clone3.c",
            "caps.c",
            "seccomp.c",
            "landlock.c",
            "namespaces.c",
            "watch.c",
        ]
        return [*COMMON, *(f"csrc/linux/{f}" for f in linux)]
    # csrc/none/: the stand-ins for a mechanism the platform does not have.
    if platform == "darwin":
        darwin = ["proctree.c", "seatbelt_apply.c"]
        none = ["cgroup.c", "seccomp.c", "landlock.c", "namespaces.c", "watch.c"]
        return [*COMMON, *(f"csrc/darwin/{f}" for f in darwin), *(f"csrc/none/{f}" for f in none)]
    if platform == "win32":
        # Job Objects (csrc/windows/); its own binding: none of the POSIX
        # core is built there (psutil's split: one binding per platform).
        return [f"csrc/windows/{f}" for f in ("_corewin.c", "job.c", "spawn.c")]
    none = ["proctree.c", "cgroup.c", "seccomp.c", "landlock.c", "namespaces.c", "watch.c"]
    return [*COMMON, *(f"csrc/none/{f}" for f in none)]


def flags(platform: str, werror: bool) -> tuple[list[str], list[tuple[str, str | None]]]:
    """Compiler options and macros for `platform`: MSVC's on Windows, gcc-
    and clang-style elsewhere (MinGW-style builds of the Windows sources are
    compiled with the latter in tests/test_cross_build.py)."""
    if platform == "win32":
        # C4152: Py_mod_exec's slot is a void *, as in every CPython module.
        args = ["/std:c11", "/W4", "/wd4152", "/utf-8", *(["/WX"] if werror else [])]
        return args, [("WIN32_LEAN_AND_MEAN", None), ("UNICODE", None), ("_UNICODE", None)]
    args = [
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Wshadow",
        "-Wformat=2",
        *(["-Werror"] if werror else []),
    ]
    return args, [("_GNU_SOURCE", None)]


compile_args, macros = flags(sys.platform, not os.environ.get("SBXLIMIT_NO_WERROR"))
link_args: list[str] = []
# The helper programs are built as in a release even then: they run inside
# sandboxes, where ASan's shadow memory cannot be reserved under a memory
# limit, and the static reaper is what runs in production.
helper_compile_args = [*compile_args, "-Os"]
if os.environ.get("SBXLIMIT_DEBUG"):
    # Undefined behaviour aborts (a report alone could scroll by unseen).
    compile_args += ["-O0", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
    compile_args += ["-fno-omit-frame-pointer"]
    link_args += ["-fsanitize=address,undefined"]
    macros.append(("SBX_NO_VFORK", "1"))


# Programs built beside the extension, per platform: (name, sources, ways
# to build it tried in order, each a list of options for the compiler and
# the linker).  Linux: the reaper a PID namespace's PID 1 execs, so that it
# need not be a fork() of the caller: without libc where the architecture
# allows (its start-up runs while the target does), else static (an exec of
# it is then the cheapest; without the reaper, PID 1 is fork()ed); and the
# sentinel that ends a killed process's sandboxes (_sentinel.py).  macOS:
# the program a sandbox's target is exec'd through, which applies the
# Seatbelt profile and reports a refusal (csrc/darwin/seatbelt_exec.c).
PID1_BARE = [
    "-DSBX_PID1_BARE",
    "-ffreestanding",
    "-fno-builtin",
    "-fno-stack-protector",
    "-fno-asynchronous-unwind-tables",
    "-nostdlib",
    "-static",
    "-s",
]
HELPERS = {
    "linux": [
        ("_pid1", ["csrc/linux/pid1.c"], [PID1_BARE, ["-static", "-s"], ["-s"]]),
        ("_sentinel", ["csrc/linux/sentinel.c"], [["-s"]]),
    ],
    "darwin": [
        (
            "_seatbelt_exec",
            ["csrc/darwin/seatbelt_exec.c", "csrc/darwin/seatbelt_apply.c"],
            [[]],
        )
    ],
}


def helpers(platform: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """The helper programs for `platform` (a sys.platform value)."""
    return HELPERS.get("linux" if platform.startswith("linux") else platform, [])


class BuildWithHelpers(build_ext):
    """Also builds the platform's helper programs into the package (HELPERS)."""

    def run(self) -> None:
        super().run()
        out = os.path.dirname(self.get_ext_fullpath("sbxlimit._core"))
        for name, srcs, ways in helpers(sys.platform):
            for i, extra in enumerate(ways):
                try:
                    objs = self.compiler.compile(
                        srcs,
                        output_dir=os.path.join(self.build_temp, f"{name}-{i}"),
                        macros=macros,
                        include_dirs=["csrc"],
                        extra_postargs=[*helper_compile_args, *extra],
                    )
                    self.compiler.link_executable(objs, name, output_dir=out, extra_postargs=extra)
                    break
                except Exception as e:  # e.g. another architecture, no static libc: the next way
                    print(f"{name} with {' '.join(extra)}: {e}", file=sys.stderr)


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it
    setup(
        cmdclass={"build_ext": BuildWithHelpers},
        ext_modules=[
            Extension(
                "sbxlimit._core",
                sources=sources(sys.platform),
                include_dirs=["csrc"],
                define_macros=macros,
                extra_compile_args=compile_args,
                extra_link_args=link_args,
            )
        ],
    )
