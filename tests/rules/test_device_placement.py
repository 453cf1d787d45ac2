"""ACC002 beyond its documented examples."""

from accrewrite.engine import Options, migrate_source

OPTIMIZER_FIRST = b"""import torch

def main(model):
    device = torch.device("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.to(device)
"""


def test_the_first_model_move_keeps_parameters_where_the_move_makes_new_ones():
    for target in ("torch_xla", "torchacc"):
        result = migrate_source(OPTIMIZER_FIRST, "t.py", Options(target=target, select=("ACC002",)))
        lines = result.output.decode().splitlines()
        assert lines[-2:] == ["    torch.__future__.set_swap_module_params_on_conversion(True)", "    model.to(device)"]
        assert result.diagnostics == []
        again = migrate_source(result.output, "t.py", Options(target=target, select=("ACC002",)))
        assert again.output == result.output
    runtime = migrate_source(OPTIMIZER_FIRST, "t.py", Options(select=("ACC002",)))
    assert b"__future__" not in runtime.output


def test_device_type_of_a_device_variable_reads_its_string():
    source = b"import torch\ndevice = 'cuda'\ndevice_type = 'cuda' if 'cuda' in device else 'cpu'\n"
    output = migrate_source(source, "t.py", Options(select=("ACC002",))).output.decode()
    assert "device = xm.xla_device()" in output
    assert "device_type = 'cuda' if 'cuda' in str(device) else 'cpu'" in output


RESUMES = b"""import torch

def main_worker(gpu, args):
    model.cuda(gpu)
    if args.resume:
        loc = 'cuda:{}'.format(gpu)
        checkpoint = torch.load(args.resume, map_location=loc)
        ema.cuda(gpu)
    criterion = torch.nn.CrossEntropyLoss().cuda(gpu)
"""


def test_a_device_chosen_in_a_branch_is_written_only_where_every_path_chose_it():
    """MoCo's and the imagenet example's ``loc``, bound where the worker resumes: a run without
    --resume would read it unbound below the branch."""
    output = migrate_source(RESUMES, "t.py", Options(select=("ACC002",))).output.decode()
    assert "    model.to(xm.xla_device())\n" in output
    assert "        ema.to(loc)\n" in output  # below the choice, in its branch
    assert "criterion = torch.nn.CrossEntropyLoss().to(xm.xla_device())" in output


def test_the_replication_of_a_device_chosen_in_a_branch_goes_where_the_run_has_that_device():
    output = migrate_source(RESUMES, "t.py", Options(select=("ACC002",))).output.decode()
    # A run may skip the branch: the target's device itself, before it.
    assert "    xm.set_replication(xm.xla_device(), [xm.xla_device()])\n    if args.resume:\n" in output
    assert output.count("set_replication") == 1
    both = b"""import torch

if torch.cuda.is_available():
    device = torch.device("cuda")
else:
    device = torch.device("cpu")
"""
    # Every path chooses the target's device (the CPU fallback is one on torchacc): once, after.
    output = migrate_source(both, "t.py", Options(target="torchacc", select=("ACC002",))).output.decode()
    assert output.endswith("else:\n    device = xm.xla_device()\nxm.set_replication(device, [device])\n")
    # The CPU stays the other path's choice on the runtime target: in the branch that chose the target's.
    output = migrate_source(both, "t.py", Options(select=("ACC002",))).output.decode()
    assert "    device = xm.xla_device()\n    xm.set_replication(device, [device])\nelse:\n" in output


def test_a_module_level_device_of_the_main_block_serves_the_functions_it_calls():
    source = b"""import torch

def train(model):
    model.cuda()

if __name__ == "__main__":
    device = torch.device("cuda")
    train(model)
"""
    output = migrate_source(source, "t.py", Options(select=("ACC002",))).output.decode()
    assert "    model.to(device)\n" in output
    assert "    device = xm.xla_device()\n    xm.set_replication(device, [device])\n    train(model)" in output
    chosen = source.replace(b'    device = torch.device("cuda")',
                            b'    if args.gpu:\n        device = torch.device("cuda")')
    output = migrate_source(chosen, "t.py", Options(select=("ACC002",))).output.decode()
    assert "    model.to(xm.xla_device())\n" in output


def _migrated(source: str, target: str = "runtime", rules: tuple[str, ...] = ("ACC002",)) -> str:
    return migrate_source(source.encode(), "t.py", Options(target=target, select=rules)).output.decode()


def test_a_cuda_device_context_that_binds_a_name_stays():
    source = "import torch\nwith torch.cuda.device(0) as gpu:\n    run(gpu)\nwith torch.cuda.device(1):\n    run()\n"
    assert _migrated(source) == "import torch\nwith torch.cuda.device(0) as gpu:\n    run(gpu)\nrun()\n"


def test_a_negated_cuda_check_leaves_the_placement_to_its_other_arms():
    source = """import torch

if args.cpu or not torch.cuda.is_available():
    device = torch.device("cpu")
elif not torch.cuda.is_available():
    print("never")
else:
    device = torch.device("cuda")
use_cpu = not torch.cuda.is_available()
"""
    output = _migrated(source, "torch_xla")
    assert 'if args.cpu:\n    device = torch_xla.device()\nelif False:\n' in output
    assert "use_cpu = not torch.cuda.is_available()\n" in output  # not in front of a placement
    assert _migrated(source).count("not torch.cuda.is_available()") == 3  # the runtime's device may be the CPU


def test_an_index_given_as_a_device_is_the_target_device_but_where_a_function_of_the_file_takes_it():
    source = """import torch

def build(device):
    return Net(rank=device)

gpu = int(os.environ["LOCAL_RANK"])
mask = torch.ones(8, device=gpu)
model = build(device=gpu)
ids = torch.arange(8, device=torch.cuda.current_device())
"""
    output = _migrated(source)
    assert "mask = torch.ones(8, device=xm.xla_device())\nmodel = build(device=gpu)\n" in output
    assert "ids = torch.arange(8, device=xm.xla_device())\n" in output


def test_the_current_device_in_a_device_choice_is_replaced_with_it():
    source = ('import torch\ndevice = f"cuda:{torch.cuda.current_device()}"\n'
              'other = torch.device("cuda", torch.cuda.current_device())\n')
    runtime = migrate_source(source.encode(), "t.py", Options())
    assert "accrt" not in runtime.output.decode() and "current_device" not in runtime.output.decode()
    xla = migrate_source(source.encode(), "t.py", Options(target="torch_xla"))
    assert xla.diagnostics == [] and "current_device" not in xla.output.decode()


def test_a_map_location_function_that_keeps_storages_on_the_cpu_stays():
    source = "import torch\nstate = torch.load(path, map_location=lambda storage: storage.cpu())\n"
    assert _migrated(source, "torch_xla") == source


def test_a_cuda_prefix_joined_to_an_index_is_a_cuda_device():
    # swav's eval_linear.py: map_location="cuda:" + str(args.gpu_to_work_on)
    source = 'import torch\nstate = torch.load(path, map_location="cuda:" + str(args.gpu))\nname = "cpu:" + str(i)\n'
    assert "map_location='cpu')" in _migrated(source, "torch_xla")
    assert "map_location=xm.xla_device())" in _migrated(source)
    assert 'name = "cpu:" + str(i)' in _migrated(source)


def test_an_index_given_to_torch_cuda_stays_for_its_own_migration():
    source = "import torch\nused = torch.cuda.memory_allocated(device=torch.cuda.current_device())\n"
    runtime = migrate_source(source.encode(), "t.py", Options()).output.decode()
    assert "used = accrt.accelerator.memory_allocated(device=accrt.accelerator.current_device())\n" in runtime
    assert _migrated(source, "torch_xla") == source


SIZED_BY_A_FORWARD_PASS = b"""import torch

def main():
    model = torch.nn.Linear(4, 2)
    features = model(torch.randn(2, 4))
    head = torch.nn.Linear(features.shape[1], 1)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    head.load_state_dict(torch.load("head.pt"))
    head.cuda()
"""


def test_an_optimizer_before_a_move_after_a_forward_pass_is_built_after_the_move():
    source = SIZED_BY_A_FORWARD_PASS.replace(b'    head.load_state_dict(torch.load("head.pt"))\n', b"")
    result = migrate_source(source, "t.py", Options(target="torch_xla", select=("ACC002",)))
    lines = result.output.decode().splitlines()
    assert lines[-2:] == ["    head.to(torch_xla.device())", "    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)"]
    assert "__future__" not in result.output.decode()  # the forward pass's graph holds the weights


def test_an_optimizer_that_cannot_be_built_after_the_move_leaves_the_file():
    result = migrate_source(SIZED_BY_A_FORWARD_PASS, "t.py", Options(target="torch_xla"))
    assert result.refused and result.output == SIZED_BY_A_FORWARD_PASS
    assert [f.message for f in result.diagnostics] == [
        "`optimizer` is built before this move, after a forward pass; file left as it is"]


def test_another_models_optimizer_before_a_move_after_a_forward_pass_stays():
    # A notebook's first model, trained on the host with its optimizer; the second is called before it moves.
    source = (b"import torch\n\nmodel = torch.nn.Linear(4, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
              b"model(torch.randn(2, 4)).sum().backward()\noptimizer.step()\n"
              b"head = torch.nn.Linear(4, 1)\npreds = head(torch.randn(2, 4))\nhead.cuda()\n")
    result = migrate_source(source, "t.py", Options(target="torch_xla"))
    assert not result.refused and b"head.to(torch_xla.device())" in result.output
    moved_first = source.replace(b"model.parameters()", b"head.parameters()")
    assert migrate_source(moved_first, "t.py", Options(target="torch_xla")).refused


def test_a_docstring_naming_the_setting_does_not_stand_for_it():
    source = b'"""It needs torch.__future__.set_swap_module_params_on_conversion(True) on XLA."""\n' + OPTIMIZER_FIRST
    output = migrate_source(source, "t.py", Options(target="torch_xla", select=("ACC002",))).output.decode()
    assert "    torch.__future__.set_swap_module_params_on_conversion(True)\n    model.to(device)" in output


def test_an_element_of_a_wrappers_positional_device_ids_is_the_target_device():
    source = b"import torch\n\ndef init_net(net, ids):\n    net.to(ids[0])\n    return torch.nn.DataParallel(net, ids)\n"
    output = migrate_source(source, "t.py", Options(select=("ACC002",))).output.decode()
    assert "    net.to(xm.xla_device())\n" in output


def test_an_assertion_that_cuda_is_there_goes_on_every_target():
    source = b"import torch\n\ndef init_net(net):\n    assert(torch.cuda.is_available())\n    return net\n"
    for target in ("runtime", "torch_xla", "torchacc"):
        result = migrate_source(source, "t.py", Options(target=target))
        assert b"assert" not in result.output and result.diagnostics == []
