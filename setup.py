"""Declares the C extension only; metadata lives in pyproject.toml.

Build switches (environment variables):
  SBXLIMIT_DEBUG=1     -O0 -g -fsanitize=address,undefined; the child is fork()ed
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
    "csrc/rlimit.c",
    "csrc/fds.c",
    "csrc/probe.c",
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
        ]
        return [*COMMON, *(f"csrc/linux/{f}" for f in linux)]
    if platform == "darwin":
        return [*COMMON, "csrc/darwin/proctree.c", "csrc/cgroup_none.c", "csrc/seccomp_none.c"]
    return [*COMMON, "csrc/proctree_none.c", "csrc/cgroup_none.c", "csrc/seccomp_none.c"]


compile_args = ["-std=c11", "-Wall", "-Wextra", "-Wshadow", "-Wformat=2"]
link_args: list[str] = []
macros = [("_GNU_SOURCE", None)]
if not os.environ.get("SBXLIMIT_NO_WERROR"):
    compile_args.append("-Werror")
if os.environ.get("SBXLIMIT_DEBUG"):
    compile_args += ["-O0", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    link_args += ["-fsanitize=address,undefined"]
    macros.append(("SBX_NO_VFORK", "1"))


class BuildWithReaper(build_ext):
    """Also builds csrc/linux/pid1.c into sbxlimit/_pid1 (Linux): the
    reaper a PID namespace's PID 1 execs, so that it need not be a fork()
    of the caller.  Static where the toolchain can (an exec of it is then
    the cheapest); without it, PID 1 is fork()ed as before."""

    def run(self) -> None:
        super().run()
        if not sys.platform.startswith("linux"):
            return
        out = os.path.dirname(self.get_ext_fullpath("sbxlimit._core"))
        objs = self.compiler.compile(
            ["csrc/linux/pid1.c"],
            output_dir=self.build_temp,
            macros=macros,
            include_dirs=["csrc"],
            extra_postargs=[*compile_args, "-Os"],
        )
        for extra in (["-static", "-s"], ["-s"]):
            try:
                self.compiler.link_executable(
                    objs, "_pid1", output_dir=out, extra_postargs=[*link_args, *extra]
                )
                return
            except Exception as e:  # e.g. no static libc: try dynamic linking
                print(f"_pid1 with {' '.join(extra)}: {e}", file=sys.stderr)


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it
    setup(
        cmdclass={"build_ext": BuildWithReaper},
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
