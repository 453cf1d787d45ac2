"""accrewrite.runtime against torch_xla 2.9 itself: the same signatures and the same behaviour
for every name both have, apart from the differences that docs/torch_xla_conformance.md lists.

``xla_conformance_probe.py`` runs once under torch_xla (``PJRT_DEVICE=CPU``, in the interpreter
``ACCREWRITE_XLA_PYTHON`` names) and once under the runtime; this compares what they print.
"""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PROBE = HERE / "xla_conformance_probe.py"
TABLE = HERE.parents[1] / "docs" / "torch_xla_conformance.md"
sys.path.insert(0, str(HERE))
from xla_conformance_probe import CASES, SURFACES  # noqa: E402

# What the table in docs/torch_xla_conformance.md excuses, in a form the checks read: extra
# keyword-only parameters, a default of ours where torch_xla's parameter has none, members of
# ours alone, and names of ours alone. Rows that describe behaviour are read by people only.
EXTRA_PARAMETERS = {
    "xla_model.all_reduce": {"compress", "bucket_cap_mb"},
    "xla_model.reduce_gradients": {"compress"},
}
DEFAULTS_OF_OURS = {"amp.autocast": {"device"}}
MEMBERS_OF_OURS = {
    "parallel_loader.MpDeviceLoader": {"dataset", "sampler", "batch_sampler", "batch_size"},
    "parallel_loader.PerDeviceLoader": {"close"},
}
NAMES_OF_OURS = {
    "xla_model.world_size", "xla_model.xrt_world_size", "xla_model.get_ordinal",
    "xla_model.dist_backend", "amp.GradScaler",
}
# XLA's CPU kernels and eager PyTorch round the same float32 math differently in the last bits.
RELATIVE_TOLERANCE = 1e-5

pytestmark = pytest.mark.xla


def _probe(command, env) -> dict:
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stderr[-4000:]}"
    return json.loads(result.stdout)


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PJRT", "XLA", "TORCHACC", "ACCREWRITE_ALLREDUCE"))
           and k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


@pytest.fixture(scope="module")
def torch_xla_side(xla_python):
    return _probe([xla_python, str(PROBE), "torch_xla"], _clean_env(PJRT_DEVICE="CPU"))


@pytest.fixture(scope="module")
def runtime_side():
    return _probe([sys.executable, str(PROBE), "runtime"], _clean_env())


def _shared(torch_xla_side, runtime_side):
    for surface in SURFACES:
        theirs = torch_xla_side["surfaces"][surface]
        ours = runtime_side["surfaces"][surface]
        for name in sorted(set(theirs) & set(ours)):
            yield f"{surface}.{name}", theirs[name], ours[name]


def _excused(qualified, signature):
    """``signature`` without the parameters and defaults the table excuses."""
    extra = EXTRA_PARAMETERS.get(qualified, set())
    defaults = DEFAULTS_OF_OURS.get(qualified, set())
    return [
        [name, kind, {"empty": True} if name in defaults else default]
        for name, kind, default in signature or []
        if name not in extra
    ]


def test_every_shared_name_has_torch_xla_signature(torch_xla_side, runtime_side):
    differences = []
    shared = list(_shared(torch_xla_side, runtime_side))
    assert len(shared) > 40, "the probe found too few shared names to compare"
    for qualified, theirs, ours in shared:
        if theirs["kind"] != ours["kind"]:
            differences.append(f"{qualified}: a {ours['kind']} here, a {theirs['kind']} in torch_xla")
            continue
        if theirs["kind"] == "constant":
            if theirs["value"] != ours["value"]:
                differences.append(f"{qualified} = {ours['value']!r}, torch_xla's is {theirs['value']!r}")
            continue
        if _excused(qualified, ours["signature"]) != theirs["signature"]:
            differences.append(f"{qualified}{ours['signature']}\n  torch_xla: {theirs['signature']}")
        if theirs["kind"] == "class":
            for method in sorted(set(theirs["methods"]) & set(ours["methods"])):
                if theirs["methods"][method] != ours["methods"][method]:
                    differences.append(f"{qualified}.{method}: {ours['methods'][method]}\n"
                                       f"  torch_xla: {theirs['methods'][method]}")
            missing = set(theirs["properties"]) - set(ours["properties"])
            if missing:
                differences.append(f"{qualified} lacks torch_xla's properties {sorted(missing)}")
            own = (set(ours["methods"]) - set(theirs["methods"])) | (set(ours["properties"]) - set(theirs["properties"]))
            if own != MEMBERS_OF_OURS.get(qualified, set()):
                differences.append(f"{qualified}: members of ours alone {sorted(own)}, documented "
                                   f"{sorted(MEMBERS_OF_OURS.get(qualified, set()))}")
    assert not differences, "\n".join(differences)


def test_every_excused_difference_is_still_one(torch_xla_side, runtime_side):
    shared = {qualified: (theirs, ours) for qualified, theirs, ours in _shared(torch_xla_side, runtime_side)}
    for qualified in {**EXTRA_PARAMETERS, **DEFAULTS_OF_OURS, **MEMBERS_OF_OURS}:
        theirs, ours = shared[qualified]
        assert ours != theirs, f"{qualified} now matches torch_xla: drop its row from the table"


def test_names_of_ours_alone_are_documented(torch_xla_side, runtime_side):
    ours_alone = {
        f"{surface}.{name}"
        for surface in SURFACES
        for name in set(runtime_side["surfaces"][surface]) - set(torch_xla_side["surfaces"][surface])
    }
    assert ours_alone == NAMES_OF_OURS


def test_the_documented_table_is_the_one_checked():
    rows = [line for line in TABLE.read_text().splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`([\w.]+)`", row.split("|")[1])}
    # "`amp.syncfree.Adam`, `AdamW`" and the like name members of one module: qualify them
    for row in rows:
        names = re.findall(r"`([\w.]+)`", row.split("|")[1])
        module = names[0].rsplit(".", 1)[0]
        documented |= {f"{module}.{name}" for name in names[1:] if "." not in name}
    checked = set(EXTRA_PARAMETERS) | set(DEFAULTS_OF_OURS) | set(MEMBERS_OF_OURS) | NAMES_OF_OURS
    assert checked <= documented, f"checked but not in {TABLE.name}: {sorted(checked - documented)}"


def _close(theirs, ours, path="result"):
    """The first place where ``ours`` differs from ``theirs`` (floats within the tolerance)."""
    if isinstance(theirs, float) and isinstance(ours, (int, float)) and not isinstance(ours, bool):
        if math.isclose(theirs, ours, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-7):
            return None
        return f"{path}: {ours!r}, torch_xla {theirs!r}"
    if isinstance(theirs, dict) and isinstance(ours, dict):
        if theirs.keys() != ours.keys():
            return f"{path}: keys {sorted(ours)}, torch_xla {sorted(theirs)}"
        return next(filter(None, (_close(theirs[k], ours[k], f"{path}.{k}") for k in theirs)), None)
    if isinstance(theirs, list) and isinstance(ours, list):
        if len(theirs) != len(ours):
            return f"{path}: {ours!r}, torch_xla {theirs!r}"
        return next(filter(None, (_close(t, o, f"{path}[{i}]") for i, (t, o) in enumerate(zip(theirs, ours)))), None)
    return None if theirs == ours else f"{path}: {ours!r}, torch_xla {theirs!r}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_behaves_as_torch_xla(case, torch_xla_side, runtime_side):
    theirs = torch_xla_side["cases"][case]
    ours = runtime_side["cases"][case]
    assert "error" not in theirs, f"the case fails on torch_xla itself: {theirs['error']}"
    difference = _close(theirs, ours)
    assert difference is None, difference
