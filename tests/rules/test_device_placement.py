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
