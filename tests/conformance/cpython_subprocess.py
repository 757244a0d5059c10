"""Run CPython's own ``test.test_subprocess`` against ``subprocess.Popen``
(``stdlib``) or with ``sbxlimit.Popen`` put in its place before the test
module is imported (``sbxlimit``), and print each test's outcome as JSON.

    python tests/conformance/cpython_subprocess.py sbxlimit > outcomes.json

The comparison lives in tests/test_cpython_conformance.py.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import unittest


class _Outcomes(unittest.TextTestResult):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.outcomes: dict[str, str] = {}
        self.details: dict[str, str] = {}

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self.outcomes[test.id()] = "passed"

    def addFailure(self, test: unittest.TestCase, err: object) -> None:
        super().addFailure(test, err)  # type: ignore[arg-type]
        self.outcomes[test.id()] = "failed"
        self.details[test.id()] = self.failures[-1][1][-2000:]

    def addError(self, test: unittest.TestCase, err: object) -> None:
        super().addError(test, err)  # type: ignore[arg-type]
        self.outcomes[test.id()] = "error"
        self.details[test.id()] = self.errors[-1][1][-2000:]

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self.outcomes[test.id()] = "skipped"

    def addExpectedFailure(self, test: unittest.TestCase, err: object) -> None:
        super().addExpectedFailure(test, err)  # type: ignore[arg-type]
        self.outcomes[test.id()] = "passed"

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self.outcomes[test.id()] = "failed"


def main() -> int:
    mode = sys.argv[1]
    if mode == "sbxlimit":
        import sbxlimit

        subprocess.Popen = sbxlimit.Popen  # type: ignore[misc]
    elif mode != "stdlib":
        raise SystemExit(f"usage: {sys.argv[0]} stdlib|sbxlimit")
    from test import test_subprocess

    suite = unittest.defaultTestLoader.loadTestsFromModule(test_subprocess)
    runner = unittest.TextTestRunner(stream=io.StringIO(), resultclass=_Outcomes, verbosity=0)
    result = runner.run(suite)
    assert isinstance(result, _Outcomes)
    json.dump({"outcomes": result.outcomes, "details": result.details}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
