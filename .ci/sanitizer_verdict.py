"""Reads the reports of a sanitizer run (.ci/sanitize) and says whether the
core is clean.

Every AddressSanitizer error fails: only the core is instrumented, so each
is the core's.  (Undefined behaviour aborts the run by itself: the build
has -fno-sanitize-recover, and its report goes to stderr.)  A leak fails
when a frame of its allocation stack is in the core (its sources under
csrc/, or the extension module itself); the interpreter's own leaks at exit
(objects it never frees, threads still running) are counted, not judged.

Usage: python .ci/sanitizer_verdict.py LOG_DIR
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LEAK = re.compile(r"^(Direct|Indirect) leak of (\d+) byte", re.M)
CORE_FRAME = re.compile(r"^\s+#\d+ .*(csrc/|sbxlimit/_core\.)", re.M)
ASAN_ERROR = re.compile(r"ERROR: AddressSanitizer: (?!.*leak)")


def leaks(text: str) -> list[str]:
    """The leak reports of one log, each with its allocation stack."""
    starts = [m.start() for m in LEAK.finditer(text)]
    return [text[a:b].strip() for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]


def main(log_dir: str) -> int:
    logs = sorted(Path(log_dir).glob("*log.*"))
    failures: list[str] = []
    interpreter = 0
    for log in logs:
        text = log.read_text(errors="replace")
        if ASAN_ERROR.search(text):
            failures.append(f"{log.name}:\n{text[:6000]}")
            continue
        for leak in leaks(text):
            if CORE_FRAME.search(leak):
                failures.append(f"{log.name}: a leak in the core:\n{leak[:4000]}")
            else:
                interpreter += 1
    print(
        f"sanitizers: {len(logs)} report file(s); {len(failures)} finding(s) in the core; "
        f"{interpreter} leak(s) of the interpreter's own at exit (not judged)"
    )
    for f in failures:
        print("\n" + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
