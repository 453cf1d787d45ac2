"""ACC009 beyond its documented examples."""

from accrewrite.engine import Options, migrate_source


def test_implicitly_concatenated_f_strings_keep_their_parts():
    source = b'''import torch
def train(loader, model, optimizer, meter):
    for i, (x, y) in enumerate(loader):
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        print(f"step {i} loss {loss.item():.4f} "
              f"{meter}")
'''
    result = migrate_source(source, "t.py", Options(select=("ACC009",)))
    assert result.error is None
    output = result.output.decode()
    assert 'lambda i, loss, meter: print(f"step {i} loss {loss.item():.4f} "' in output
    compile(result.output, "t.py", "exec")


def test_the_closure_keeps_the_other_rules_changes_inside_the_call():
    """A logging call that moves into a step closure carries the other rules' fixes made inside
    it: ``y.cuda()`` migrated (else a second run would migrate it) and ``model.module``
    unwrapped (else the closure reads an attribute the unwrapped model does not have)."""
    source = b'''import torch
def train(model, loader, optimizer, writer):
    model = torch.nn.parallel.DistributedDataParallel(model)
    for step, (x, y) in enumerate(loader):
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        writer.add_scalar("acc", (model(x).argmax(1) == y.cuda()).float().mean().item(), step)
        print(loss.item(), model.module.scale.item())
'''
    for target in ("runtime", "torch_xla", "torchacc"):
        result = migrate_source(source, "t.py", Options(target=target))
        assert result.error is None
        output = result.output.decode()
        assert "xm.add_step_closure(" in output and ".cuda()" not in output and ".module" not in output, output
        again = migrate_source(result.output, "t.py", Options(target=target))
        assert again.error is None and again.output == result.output, target


def test_a_logging_call_whose_arguments_are_all_values_runs_inside_its_closure():
    """``writer.add_image(tag, grid, global_step=step)`` (a tensor made by a library the analysis
    cannot type): the call is what the closure runs, never a value computed before the closure
    and handed to one that only returns it."""
    source = b'''import torch
import torchvision
from torch.utils.tensorboard import SummaryWriter

device = "cuda" if torch.cuda.is_available() else "cpu"
gen = torch.nn.Linear(64, 784).to(device)
optimizer = torch.optim.Adam(gen.parameters())
writer = SummaryWriter("logs")
step = 0
for x, y in loader:
    loss = gen(x).sum()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        grid = torchvision.utils.make_grid(gen(noise).reshape(-1, 1, 28, 28), normalize=True)
        writer.add_image("fake", grid, global_step=step)
        step += 1
'''
    output = migrate_source(source, "t.py", Options(target="torch_xla")).output.decode()
    assert 'lambda grid, step: writer.add_image("fake", grid, global_step=step),' in output
    assert "args=(grid, step)," in output
