"""Supported host ranges come from the package metadata and are enforced when a plugin loads its host."""

import pytest

from threadweaver import hosts


@pytest.fixture
def installed(monkeypatch):
    """Pretend another version of a host is installed."""

    def pretend(version: str) -> None:
        monkeypatch.setattr(hosts.metadata, "version", lambda name: version)
        hosts.check_host.cache_clear()

    yield pretend
    hosts.check_host.cache_clear()


def test_the_ranges_are_the_ones_pyproject_declares():
    assert hosts.supported_range("trl") == "trl>=1.16,<1.17"
    assert hosts.supported_range("lm_eval") == "lm-eval>=0.4.13,<0.5"
    hosts.check_host("trl")  # the installed one is supported


def test_a_host_outside_its_range_is_refused_with_the_range(installed, monkeypatch):
    installed("2.0.0")
    with pytest.raises(hosts.UnsupportedHostError, match=r"supports trl>=1.16,<1.17, but trl 2.0.0 is installed"):
        hosts.check_host("trl")
    monkeypatch.setenv(hosts.ALLOW_ENV, "1")
    hosts.check_host.cache_clear()
    with pytest.warns(RuntimeWarning, match="trl 2.0.0"):
        hosts.check_host("trl")


def test_an_unbounded_or_absent_module_passes():
    hosts.check_host("json")
    assert hosts.supported_range("json") == "any json"


def test_a_warning_a_host_repeats_from_several_modules_is_said_once(monkeypatch):
    """TRL warned of vLLM's version five times as threadweaver.trl_pgrpo imported it; "once" is once per module. What
    the block says before it fails is still said, and a filter a module adds inside is kept."""
    import warnings

    from threadweaver.hosts import each_warning_once

    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        monkeypatch.setattr(warnings, "showwarning", lambda message, *args, **kwargs: shown.append(str(message)))
        with pytest.raises(ImportError), each_warning_once():
            for module in ("a", "b", "c"):  # the same words from three modules, each at its own line
                warnings.warn_explicit("vLLM 9 is not supported", UserWarning, f"{module}.py", 1, registry={})
            warnings.warn_explicit("another", UserWarning, "a.py", 2, registry={})
            warnings.filterwarnings("ignore", message="added inside")
            raise ImportError("vLLM 9")
        warnings.warn("added inside, and kept", stacklevel=1)
    assert shown == ["vLLM 9 is not supported", "another"]
