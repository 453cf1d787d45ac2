"""``accrewrite.runtime.nn`` exports each of its modules' ``__all__``, read from their sources:
every name the runtime's profile imports from it resolves, and to the module that defines it."""

import re
from importlib import resources

import pytest

pytest.importorskip("torch")

import accrewrite.runtime.nn as nn


def _profile_names() -> list[str]:
    profile = resources.files("accrewrite.rules").joinpath("targets/runtime.toml").read_text()
    return re.findall(r"from accrewrite\.runtime\.nn import (\w+)", profile)


def test_the_names_the_profile_imports_are_exported_by_their_modules():
    names = _profile_names()
    assert len(names) >= 9
    for name in names:
        assert name in nn.__all__
        assert getattr(nn, name).__module__.startswith("accrewrite.runtime.nn.")


def test_a_name_no_module_exports_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'Missing'"):
        nn.Missing  # noqa: B018
