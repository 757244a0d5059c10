"""sbxlimit: run untrusted or buggy programs under enforced limits and a sandbox.

    >>> import sbxlimit
    >>> r = sbxlimit.run(["python3", "-c", "print('hi')"], capture_output=True,
    ...                  limits=sbxlimit.Limits(memory="256Mi", wall_time="10s"))
    >>> r.stdout, r.termination.reason
    (b'hi\\n', 'exited')

See docs/api.md.
"""

import sys as _sys
from subprocess import DEVNULL, PIPE, STDOUT, CalledProcessError, SubprocessError, TimeoutExpired
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._config import load_config
    from ._doctor import Check, Report, doctor
    from ._enforcement import Enforcement, Mechanism
    from ._errors import (
        CallTimeout,
        ConcurrencyLimited,
        ConfigError,
        Error,
        LimitExceeded,
        QuotaExceeded,
        RateLimited,
        RunTimeout,
        SandboxSetupError,
        StoreUnavailable,
        UnknownFieldError,
        UnsupportedError,
    )
    from ._evidence import Usage
    from ._limits import Limits
    from ._policy import Policy
    from ._popen import Popen
    from ._quota import Quota
    from ._redis import RedisStore
    from ._run import SandboxResult, run
    from ._spawn import STEPS
    from ._termination import LIMIT_REASONS, REASONS, Reason, Termination
    from .gate import Gate, GateCall, GateStats

# Names load on first use (PEP 562): `import sbxlimit` -- and the pytest
# plugin, loaded in every test session -- costs almost nothing until a
# sandbox, the doctor or a gate is actually used.  The exit steps' module
# loads now: a multiprocessing child must hook its end before its target
# returns, which may be before its first sandbox (one from a thread).
from . import _exit  # noqa: F401

_LAZY = {
    "Check": "_doctor",
    "Report": "_doctor",
    "doctor": "_doctor",
    "load_config": "_config",
    "Enforcement": "_enforcement",
    "Mechanism": "_enforcement",
    "CallTimeout": "_errors",
    "ConcurrencyLimited": "_errors",
    "ConfigError": "_errors",
    "Error": "_errors",
    "LimitExceeded": "_errors",
    "QuotaExceeded": "_errors",
    "RateLimited": "_errors",
    "RunTimeout": "_errors",
    "SandboxSetupError": "_errors",
    "StoreUnavailable": "_errors",
    "UnknownFieldError": "_errors",
    "UnsupportedError": "_errors",
    "Gate": "gate",
    "GateCall": "gate",
    "GateStats": "gate",
    "Limits": "_limits",
    "Policy": "_policy",
    "Popen": "_popen",
    "Quota": "_quota",
    "RedisStore": "_redis",
    "SandboxResult": "_run",
    "run": "_run",
    "STEPS": "_spawn",
    "LIMIT_REASONS": "_termination",
    "REASONS": "_termination",
    "Reason": "_termination",
    "Termination": "_termination",
    "Usage": "_evidence",
}
if _sys.platform == "win32":  # the program is born in a Job Object (_winjob)
    _LAZY["Popen"] = "_winpopen"


def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name)
    if module is None:
        # A submodule (sbxlimit._cgroup, sbxlimit.audit) used as an
        # attribute, as it could be when the package imported everything.
        try:
            return importlib.import_module(f"sbxlimit.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"sbxlimit.{name}":
                raise  # the submodule exists; something it imports does not
            raise AttributeError(f"module 'sbxlimit' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"sbxlimit.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "DEVNULL",
    "LIMIT_REASONS",
    "PIPE",
    "REASONS",
    "STDOUT",
    "STEPS",
    "CallTimeout",
    "CalledProcessError",
    "Check",
    "ConcurrencyLimited",
    "ConfigError",
    "Enforcement",
    "Error",
    "Gate",
    "GateCall",
    "GateStats",
    "LimitExceeded",
    "Limits",
    "Mechanism",
    "Policy",
    "Popen",
    "Quota",
    "QuotaExceeded",
    "RateLimited",
    "Reason",
    "RedisStore",
    "Report",
    "RunTimeout",
    "SandboxResult",
    "SandboxSetupError",
    "StoreUnavailable",
    "SubprocessError",
    "Termination",
    "TimeoutExpired",
    "UnknownFieldError",
    "UnsupportedError",
    "Usage",
    "doctor",
    "load_config",
    "run",
]
