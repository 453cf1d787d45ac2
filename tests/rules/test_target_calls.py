"""A guard against drift between what the rules write and what runs it.

Every ``xm.``, ``pl.`` and ``syncfree.`` call a target profile (``rules/targets/*.toml``) can
emit must exist in accrewrite.runtime and accept the arguments the profile passes: the
``runtime`` target's names directly, the ``torchacc`` target's through TorchAcc's module names
(``accrewrite.runtime.torchacc_names``), and the ``torch_xla`` target's in the runtime's torch_xla
modules. Under torch_xla 2.9 (``ACCREWRITE_XLA_PYTHON``), the ``torch_xla`` target's calls must
also exist in torch_xla and accept the same arguments.
"""

import ast
import importlib
import inspect
import json
import os
import subprocess
import sys

import pytest

from accrewrite.rules.acc008_syncfree_optimizer import _ACCEPTED as SYNCFREE_ARGUMENTS
from accrewrite.runtime.torchacc_names import counterpart
from accrewrite.targets import all_targets, import_bindings

CHECKED_ALIASES = ("xm", "pl", "syncfree")
# the torch_xla modules the runtime mirrors (docs/torch_xla_conformance.md)
TORCH_XLA_MODULES = {
    "torch_xla.core.xla_model": "accrewrite.runtime.xla_model",
    "torch_xla.distributed.parallel_loader": "accrewrite.runtime.parallel_loader",
    "torch_xla.amp.syncfree": "accrewrite.runtime.amp.syncfree",
    "torch_xla.amp": "accrewrite.runtime.amp",
}


def _templates(concept):
    """The concept's code with placeholders filled: ``syncfree.{name}`` once per optimizer."""
    texts = [concept.expr] if concept.expr is not None else list(concept.stmts)
    for text in texts:
        if "syncfree.{name}" in text:
            for name, arguments in SYNCFREE_ARGUMENTS.items():
                keywords = ", ".join(f"{a}=_" for a in arguments[1:])
                yield text.replace("syncfree.{name}", f"syncfree.{name}(_, {keywords})").replace("{{", "{").replace("}}", "}")
        else:
            yield text.format_map(_Placeholders())


class _Placeholders(dict):
    def __missing__(self, key):
        return "_"


def emitted_calls():
    """``(target, concept, module, attribute, positional count, keyword names)`` for every
    checked alias a profile's code uses; a reference that is not called (``atexit.register(
    xm.mark_step)``) is a call without arguments."""
    calls = set()
    for target in all_targets().values():
        aliases = {
            alias: module
            for line in target.imports.values()
            for alias, module in import_bindings(line)
            if alias in CHECKED_ALIASES
        }
        for concept in target.concepts.values():
            for text in _templates(concept):
                tree = ast.parse(text)
                called = set()
                for node in ast.walk(tree):
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                        called.add(id(node.func))
                        owner = node.func.value
                        if isinstance(owner, ast.Name) and owner.id in aliases:
                            calls.add((target.name, concept.name, aliases[owner.id], node.func.attr,
                                       len(node.args), tuple(sorted(k.arg for k in node.keywords))))
                for node in ast.walk(tree):
                    if (isinstance(node, ast.Attribute) and id(node) not in called
                            and isinstance(node.value, ast.Name) and node.value.id in aliases):
                        calls.add((target.name, concept.name, aliases[node.value.id], node.attr, 0, ()))
    return sorted(calls)


def _runtime_module(target, module):
    if target == "torchacc":
        return counterpart(module)
    if target == "torch_xla":
        return TORCH_XLA_MODULES[module]
    return module


def _binds(function, positional, keywords):
    """None if ``function`` accepts the call, else why not."""
    if function is None:
        return "missing"
    try:
        inspect.signature(function).bind(*range(positional), **dict.fromkeys(keywords))
    except TypeError as error:
        return f"does not accept the call: {error}"
    return None


CALLS = emitted_calls()


def test_the_profiles_emit_calls_of_every_kind():
    attributes = {(target, module.rsplit(".", 1)[-1], attribute) for target, _, module, attribute, *_ in CALLS}
    assert ("runtime", "xla_model", "reduce_gradients") in attributes
    assert ("torchacc", "xla_model", "xrt_world_size") in attributes
    assert ("torch_xla", "parallel_loader", "MpDeviceLoader") in attributes
    assert {("torchacc", "syncfree", "AdamW"), ("torch_xla", "syncfree", "SGD")} <= attributes


@pytest.mark.parametrize("call", CALLS, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}")
def test_every_emitted_call_exists_in_the_runtime(call):
    target, concept, module, attribute, positional, keywords = call
    runtime_module = importlib.import_module(_runtime_module(target, module))
    problem = _binds(getattr(runtime_module, attribute, None), positional, keywords)
    assert problem is None, f"{target} target, concept {concept}: {runtime_module.__name__}.{attribute} {problem}"


CHECK_UNDER_TORCH_XLA = """
import importlib, inspect, json, sys
problems = []
for module, attribute, positional, keywords in json.loads(sys.argv[1]):
    function = getattr(importlib.import_module(module), attribute, None)
    try:
        if function is None:
            raise TypeError("missing")
        inspect.signature(function).bind(*range(positional), **dict.fromkeys(keywords))
    except TypeError as error:
        problems.append(f"{module}.{attribute}: {error}")
print(json.dumps(problems))
"""


@pytest.mark.xla
def test_every_torch_xla_call_exists_in_torch_xla(xla_python):
    wanted = sorted({(module, attribute, positional, keywords)
                     for target, _, module, attribute, positional, keywords in CALLS if target == "torch_xla"})
    assert len(wanted) > 10
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT", "XLA"))}
    run = subprocess.run([xla_python, "-c", CHECK_UNDER_TORCH_XLA, json.dumps(wanted)],
                         capture_output=True, text=True, env={**env, "PJRT_DEVICE": "CPU"}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.splitlines()[-1]) == []


def test_a_call_the_runtime_lacks_is_caught():
    assert _binds(getattr(sys.modules[__name__], "no_such_function", None), 0, ()) == "missing"
    assert "does not accept" in _binds(lambda a: a, 0, ("b",))
