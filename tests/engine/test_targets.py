"""Target profiles: the catalogue of concepts and the rules' own definitions they are checked
against, and targets that installed packages add through the ``accrewrite.targets`` entry-point
group."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from accrewrite import cli, explain, registry, targets
from accrewrite.concepts import CATALOGUE, SPELLING, Definition, Kind
from accrewrite.engine import Options, migrate_source
from accrewrite.rule import Rule

ROOT = Path(__file__).resolve().parents[2]
XPU = Path(__file__).with_name("xpu_target")  # a package outside accrewrite that adds the target `xpu`
# How a rule or the engine names a concept: the target's has/concept, the context's expr/statements,
# the profiles' callees, a rule's `concepts`, and the fused rules' `swaps`.
_READS = re.compile(r"\b(?:has|concept|expr|statements|spelled_callees|called_names)\(((?:\s*[\"']\w+[\"']\s*,?)+)")


def _named_concepts() -> dict[str, set[str]]:
    """Every concept name the rules and the engine read, by file."""
    found: dict[str, set[str]] = {}
    for path in [*ROOT.joinpath("rules").glob("*.py"), *ROOT.joinpath("accrewrite").glob("*.py")]:
        text = path.read_text()
        names = {name for args in _READS.findall(text) for name in re.findall(r"[\"'](\w+)[\"']", args)}
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            assigned = getattr(node.targets[0], "id", "")
            if assigned == "concepts" and isinstance(node.value, ast.Tuple):
                names |= {v.value for v in node.value.elts if isinstance(v, ast.Constant)}
            elif assigned in ("swaps", "_CONCEPT_OF"):  # name -> concept, a dict or a read-only one
                table = node.value.args[0] if isinstance(node.value, ast.Call) else node.value
                names |= {v.value for v in table.values if isinstance(v, ast.Constant)}
        if names:
            found[path.name] = names
    return found


def _definitions() -> dict[str, Definition]:
    """The catalogue's definitions and the rules' own."""
    defined = {d.name: d for rule in registry.all_rules().values() for d in rule.defines}
    return {**CATALOGUE, **defined}


def test_the_catalogue_and_the_rules_define_every_concept_a_rule_reads_and_nothing_else():
    named, known = _named_concepts(), set(_definitions())
    for where, names in named.items():
        assert names <= known, f"{where} reads {sorted(names - known)}, defined neither in the catalogue nor by a rule"
    read = set().union(*named.values())
    assert known - read == set()
    assert {"gradient_allreduce", "device_loader", "lazy_execution", "accelerator_available"} <= read
    assert {"fused_layer_norm", "window_process", "dcn"} <= known - set(CATALOGUE)


def test_each_bundled_profile_spells_its_concepts_as_their_definitions_say():
    definitions = _definitions()
    for target in targets.all_targets().values():
        for name, concept in target.concepts.items():
            assert ("expr" if concept.expr is not None else "stmts") in definitions[name].forms
        assert all(definitions[name].kind is Kind.CAPABILITY for name in target.capabilities)
    assert targets.get_target("torch_xla").has("lazy_execution", "device")
    assert not targets.get_target("runtime").has("lazy_execution")


def profile(**concepts):
    data = {"name": "xpu", "imports": {"torch": "import torch"},
            "concepts": {"device": {"expr": "torch.device('xpu')", "imports": ["torch"]}}}
    data["concepts"].update(concepts)
    return data


@pytest.mark.parametrize("data, message", [
    (profile(lazy_execution={"expr": "True"}), "'lazy_execution' is a capability, which has no spelling: list it "
                                                "under [capabilities] as lazy_execution = true"),
    (profile(seed={"expr": "torch.xpu.manual_seed({seed})"}), "[concepts.seed]: 'seed' is statements, spelled with "
                                                              "stmts"),
    (profile(synchronize={"stmts": ["torch.xpu.synchronize()"]}), "'synchronize' is an expression, spelled with expr"),
    (profile(device_loader={"expr": "wrap({loader}, {dev})"}), "uses {dev}, which the rules do not fill (they fill: "
                                                                "{loader}, {device})"),
    (profile(synchronize={"expr": "torch.xpu.synchronize("}), "'torch.xpu.synchronize(' is not a Python expression"),
    (profile(dist_backend={"expr": "'xccl'", "keep": True}), "[concepts.dist_backend]: 'keep' means nothing for "
                                                             "'dist_backend'"),
    (profile(synchronize={"expr": "torch.xpu.synchronize()", "imports": ["torhc"]}),
     "imports 'torhc', not in [imports]; did you mean 'torch'?"),
    (profile(synchronize={"expr": "torch.xpu.synchronize()", "import": ["torch"]}),
     "[concepts.synchronize]: unknown key 'import'; did you mean 'imports'?"),
    (profile(step_closure={"expr": "later({closure}, {args})"}),
     "xpu.toml: 'step_closure' needs 'mark_step' too"),
    (profile(autocast={"expr": "torch.autocast"}), "'autocast' needs one of 'grad_scaler', 'disabled_grad_scaler'"),
    ({**profile(), "concept": {}}, "xpu.toml: unknown key 'concept'; did you mean 'concepts'?"),
    ({**profile(), "capabilities": {"lazy_exec": True}},
     "'lazy_exec' is no capability; did you mean 'lazy_execution'?"),
    ({**profile(), "capabilities": {"device": True}}, "'device' is no capability: 'device' has a spelling"),
    ({**profile(), "verify": {"host_random": True}}, "[verify]: host_random and executions are about the device"),
    ({**profile(), "verify": {"device": "xpu", "executions": {"metrics": "m"}}},
     "executions names metrics, compiles, executions, all three"),
    ({**profile(), "verify": {"device": "xpu", "executions": {"metrics": "m", "compiles": "C", "executions": "E",
                                                              "wait": "m.wait"}}},
     "executions' wait names a function as module:function, not 'm.wait'"),
    ({**profile(), "verify": {"device": "xpu", "executions": {"metrics": "m", "compiles": "C", "executions": "E",
                                                              "analysis": {"LEVEL": 1}}}},
     "executions' analysis is a table of strings"),
    ({**profile(), "verify": {"paced_loader": "vendor.loader.Prefetcher"}},
     "[verify]: paced_loader names a class as module:Class, not 'vendor.loader.Prefetcher'"),
    ({"name": "xpu", "concepts": {}}, "xpu.toml: no [concepts.device] (the training device"),
    ({**profile(), "imports": {"torch": "torch"}}, "[imports] torch = 'torch' is not one import statement"),
    ({**profile(), "verify": "xpu"}, "xpu.toml: verify is a table ([verify] or verify = { ... }), not 'xpu'"),
])
def test_a_profile_is_checked_against_the_catalogue_when_it_loads(data, message):
    with pytest.raises(targets.ProfileError) as raised:
        targets._parse(data, "xpu.toml")
    assert message in str(raised.value)


def test_a_concept_the_catalogue_lacks_is_kept_unchecked_until_the_rules_load():
    target = targets._parse(profile(mish={"expr": "Mish", "imports": ["torch"]}), "xpu.toml")
    assert target.concept("mish").expr == "Mish"
    assert target.unchecked == (targets.Unchecked("mish", {"expr": "Mish", "imports": ["torch"]}, "xpu.toml"),)


def test_a_concept_may_name_its_import_line_in_place_of_a_key():
    line = "from xpu_kernels import synchronize"
    target = targets._parse(profile(synchronize={"expr": "synchronize()", "imports": [line]}), "xpu.toml")
    assert target.concept("synchronize").imports == (line,)
    assert target.import_line(line) == line
    assert target.imports["torch"] == "import torch"


def test_capabilities_and_the_verify_table_load():
    data = {**profile(mark_step={"stmts": ["torch.xpu.synchronize()"]}), "capabilities": {"lazy_execution": True,
                                                                                          "shared_memory": False},
            "verify": {"device": "xpu", "environment": {"XPU_MODE": "cpu"}, "paced_loader": "vendor.loader:Prefetcher"}}
    target = targets._parse(data, "xpu.toml")
    assert target.has("lazy_execution", "device") and not target.has("shared_memory")
    assert target.verify == targets.Verification(device="xpu", environment={"XPU_MODE": "cpu"},
                                                 paced_loader="vendor.loader:Prefetcher")
    assert targets.get_target("torch_xla").verify.metrics == "torch_xla.debug.metrics"


class EntryPoint:
    def __init__(self, name, value, loaded):
        self.name, self.value, self.loaded = name, value, loaded

    def load(self):
        return self.loaded


@pytest.fixture
def installed(monkeypatch):
    """Installs targets as entry points would (``installed(name, package)``), for this test."""
    found = []

    def install(name, package):
        found.append(EntryPoint(name, package.__name__, package))

    monkeypatch.setattr(targets, "entry_points", lambda group: found if group == targets.ENTRY_POINT_GROUP else [])
    caches = (targets.all_targets, targets.spelled_callees, targets.called_names, registry.all_rules)
    for cache in caches:
        cache.cache_clear()
    yield install
    for cache in caches:
        cache.cache_clear()


@pytest.fixture
def acc_xpu(monkeypatch):
    monkeypatch.syspath_prepend(str(XPU))
    import acc_xpu

    return acc_xpu


def test_an_entry_point_adds_a_target(installed, acc_xpu):
    installed("xpu", acc_xpu)
    assert list(targets.all_targets()) == ["runtime", "torch_xla", "torchacc", "xpu"]
    assert "did you mean 'xpu'?" in targets.unknown_target("xpuu")
    source = b"import torch\ndevice = torch.device('cuda')\ntorch.cuda.synchronize()\n"
    result = migrate_source(source, options=Options(target="xpu"))
    assert result.output.decode() == (
        "import torch\nimport os\ndevice = torch.device('xpu', int(os.environ.get('LOCAL_RANK', 0)))\n"
        "torch.xpu.synchronize()\n")


def package(tmp_path, monkeypatch, name, **profiles):
    """A package on the path holding ``profiles`` (file stem -> TOML text)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for stem, text in profiles.items():
        (folder / f"{stem}.toml").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return __import__(name)


def test_an_installed_target_is_named_as_its_entry_point(installed, tmp_path, monkeypatch):
    xpu = (XPU / "acc_xpu" / "xpu.toml").read_text()
    installed("gpu", package(tmp_path, monkeypatch, "acc_gpu", gpu=xpu))
    with pytest.raises(targets.ProfileError, match="the profile is named 'xpu', its entry point 'gpu'"):
        targets.all_targets()


def test_an_installed_target_takes_no_bundled_targets_name(installed, tmp_path, monkeypatch):
    runtime = (XPU / "acc_xpu" / "xpu.toml").read_text().replace('name = "xpu"', 'name = "runtime"')
    installed("runtime", package(tmp_path, monkeypatch, "acc_runtime", runtime=runtime))
    with pytest.raises(targets.ProfileError, match=r"acc_runtime/runtime.toml \(.*\) and runtime.toml both define "
                                                   "target 'runtime'"):
        targets.all_targets()


def test_a_broken_installed_profile_is_an_error_that_names_its_file(installed, tmp_path, monkeypatch, capsys):
    npu = ('name = "npu"\n[concepts.device]\nexpr = "torch.device(\'npu\')"\n'
           '[concepts.sychronize]\nexpr = "torch.npu.synchronize()"\n')
    installed("npu", package(tmp_path, monkeypatch, "acc_npu", npu=npu))
    assert cli.main(["rules"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    where = tmp_path / "acc_npu" / "npu.toml"
    assert f"error: {where} (accrewrite.targets entry point 'npu' = 'acc_npu'): [concepts.sychronize]" in err
    assert "did you mean 'synchronize'?" in err


def test_a_rule_that_needs_an_uncatalogued_concept_is_refused(monkeypatch):
    class Shard(Rule):
        code, name, summary, concepts = "XYZ002", "shard", "demo", ("devcie",)

    monkeypatch.setattr(registry, "entry_points", lambda group: [EntryPoint("shard", "x", Shard)]
                        if group == registry.ENTRY_POINT_GROUP else [])
    registry.all_rules.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="rule XYZ002 .* needs concept 'devcie', which is not in the catalogue "
                                               r"\(accrewrite/concepts.py\) or its `defines`; did you mean 'device'\?"):
            registry.all_rules()
    finally:
        registry.all_rules.cache_clear()


class Mish(Rule):
    code, name, summary, concepts = "XYZ003", "mish", "demo", ("mish",)
    defines = (Definition("mish", SPELLING, "torch.nn.Mish, fused"),)


@pytest.fixture
def rules(monkeypatch):
    """Adds rules as entry points would (``rules(Rule, ...)``), for this test."""
    added = []
    monkeypatch.setattr(registry, "entry_points", lambda group: [EntryPoint(r.name, "x", r) for r in added]
                        if group == registry.ENTRY_POINT_GROUP else [])
    registry.all_rules.cache_clear()
    yield added.extend
    registry.all_rules.cache_clear()


def installed_spelling(installed, tmp_path, monkeypatch, **spellings):
    """Installs the target `xpu` with ``spellings`` (concept -> TOML table) added to its profile."""
    xpu = (XPU / "acc_xpu" / "xpu.toml").read_text()
    added = "".join(f"\n[concepts.{name}]\n{table}\n" for name, table in spellings.items())
    name = f"acc_{tmp_path.name}"  # a package of its own: each test's profile, not the one imported first
    installed("xpu", package(tmp_path, monkeypatch, name, xpu=xpu + added))
    return name


def test_a_rule_defines_its_own_concept_which_a_profile_spells(installed, rules, tmp_path, monkeypatch):
    installed_spelling(installed, tmp_path, monkeypatch, mish='expr = "torch.nn.Mish"\nimports = ["torch"]')
    rules([Mish])
    assert registry.all_rules()["XYZ003"] is Mish
    assert Mish.supported_targets() == ["xpu"]
    assert "`mish`: torch.nn.Mish, fused" in explain.markdown(Mish)


def test_a_profile_naming_a_concept_no_rule_defines_fails_once_the_rules_load(installed, rules, tmp_path,
                                                                               monkeypatch, capsys):
    name = installed_spelling(installed, tmp_path, monkeypatch, mihs='expr = "torch.nn.Mish"\nimports = ["torch"]')
    rules([Mish])
    assert "mihs" in targets.get_target("xpu").concepts  # loaded without the rules
    assert cli.main(["migrate", "-", "--target", "xpu"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (f"error: {tmp_path / name / 'xpu.toml'} (accrewrite.targets entry point 'xpu' = "
            f"'{name}'): [concepts.mihs]: 'mihs' is no concept a rule asks for; did you mean 'mish'? (the "
            "catalogue is accrewrite/concepts.py, or a rule's `defines`)") in err


def test_a_rule_defined_concept_spelled_with_the_wrong_form_fails(installed, rules, tmp_path, monkeypatch):
    installed_spelling(installed, tmp_path, monkeypatch, mish='stmts = ["torch.nn.Mish"]\nimports = ["torch"]')
    rules([Mish])
    with pytest.raises(targets.ProfileError, match=r"\[concepts.mish\]: 'mish' is a spelling, spelled with expr"):
        registry.all_rules()


def test_two_rules_defining_one_concept_are_refused(rules):
    class OtherMish(Rule):
        code, name, summary = "XYZ004", "other-mish", "demo"
        defines = (Definition("mish", SPELLING, "torch.nn.Mish, another"),)

    rules([Mish, OtherMish])
    with pytest.raises(RuntimeError, match=f"rules {__name__} and {__name__} both define concept 'mish'"):
        registry.all_rules()


def test_a_rule_defining_a_catalogue_concept_is_refused(rules):
    class Device(Rule):
        code, name, summary, concepts = "XYZ005", "device", "demo", ("device",)
        defines = (Definition("device", SPELLING, "the device, again"),)

    rules([Device])
    with pytest.raises(RuntimeError, match=r"rule XYZ005 .* defines concept 'device', which the catalogue "
                                           r"\(accrewrite/concepts.py\) defines already"):
        registry.all_rules()


@pytest.mark.slow
def test_a_package_installed_outside_accrewrite_adds_a_fourth_target_that_migrates_the_examples(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, XPU],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (site / "acc_xpu" / "xpu.toml").is_file()
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for train in ROOT.glob("examples/*/train.py"):
        (scripts / f"{train.parent.name}.py").write_bytes(train.read_bytes())
    env = {**os.environ, "PYTHONPATH": str(site)}

    def accrewrite(*args):
        done = subprocess.run([sys.executable, "-m", "accrewrite.cli", *map(str, args)], capture_output=True,
                              text=True, env=env, cwd=tmp_path)
        return done.returncode, done.stdout, " ".join(done.stderr.split())

    code, out, err = accrewrite("migrate", scripts, "--target", "xpu", "--in-place")
    assert code == 0, out + err
    migrated = {path.stem: path.read_text() for path in scripts.glob("*.py")}
    assert len(migrated) == 7
    for name, text in migrated.items():
        tree = ast.parse(text)
        compile(tree, name, "exec")
        assert "torch.device('xpu', int(os.environ.get('LOCAL_RANK', 0)))" in text, name
        calls = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
        placing = {"torch.cuda.set_device", "torch.cuda.synchronize", "torch.cuda.manual_seed",
                   "torch.cuda.manual_seed_all"}
        assert not {call for call in calls if call.endswith(".cuda") or call in placing}, name
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert not {module for module in imported if module.startswith(("accrewrite", "torch_xla"))}, name
    for ddp in ("ddp_gpt", "torchrun_ddp", "nanogpt", "imagenet"):
        assert "backend='xccl'" in migrated[ddp] and "DistributedDataParallel" in migrated[ddp]  # DDP stays
    assert "torch.xpu.manual_seed_all(" in migrated["mnist"]
    assert accrewrite("migrate", scripts, "--target", "xpu", "--check")[0] == 0  # nothing left to change
    code, out, err = accrewrite("migrate", scripts, "--target", "xpuu")
    assert code == 2
    assert "unknown target 'xpuu'; did you mean 'xpu'? (choose from runtime, torch_xla, torchacc, xpu)" in err


def test_an_import_line_binds_its_names_as_the_analysis_records_them():
    assert targets.import_bindings("import torch_xla.core.xla_model") == (("torch_xla", "torch_xla"),)
    assert targets.import_bindings("import torch_xla.core.xla_model as xm") == (("xm", "torch_xla.core.xla_model"),)
    assert targets.import_bindings("from torch_xla.amp import syncfree, autocast as ac") == (
        ("syncfree", "torch_xla.amp.syncfree"), ("ac", "torch_xla.amp.autocast"),
    )
    assert targets.import_bindings("from torch_xla.amp import *") == ()
