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


_LOGGED_READ = '''import torch
def train(model, loader, optimizer):
    D_x = 0.0
    for i, (x, y) in enumerate(loader):
        output = model(x)
        loss = output.sum()
        loss.backward()
        optimizer.step()
        {assign}
        {other}
        print(f"step {{i}} loss {{loss.item():.4f}} D(x) {{D_x:.4f}}")
    {after}
'''


def _logged_read(assign="D_x = output.mean().item()", other="", after=""):
    source = _LOGGED_READ.format(assign=assign, other=other or "pass", after=after or "pass").encode()
    result = migrate_source(source, "t.py", Options(select=("ACC009",)))
    assert result.error is None
    compile(result.output, "t.py", "exec")
    return result.output.decode()


def test_a_host_read_only_logged_stays_on_the_device_and_is_read_in_the_closure():
    output = _logged_read()
    assert "D_x = output.mean().detach()" in output
    assert 'print(f"step {i} loss {loss.item():.4f} D(x) {D_x.item():.4f}")' in output
    assert "args=(i, loss.detach(), D_x)" in output
    output = _logged_read(assign="D_x = float(output.mean())")
    assert "D_x = output.mean().detach()" in output and "{float(D_x):.4f}" in output


def test_a_host_read_of_a_tensor_that_may_change_in_place_is_copied():
    output = _logged_read(assign="D_x = loss.item()")
    assert "D_x = loss.detach().clone()" in output and "{D_x.item():.4f}" in output


def test_a_host_read_used_elsewhere_stays_a_number():
    for other, after in (
        ("history.append(D_x)", ""),
        ("best = max(best, D_x)", ""),
        ("total = total + D_x", ""),
        ("", "return D_x"),
        ("", "print(D_x)"),
        ("callbacks.append(lambda: D_x)", ""),
    ):
        output = _logged_read(other=other, after=after)
        assert "D_x = output.mean().item()" in output, (other, after)
        assert "D_x.item()" not in output and "{D_x:.4f}" in output, (other, after)


def test_a_host_read_that_another_binding_reaches_stays_a_number():
    """The print may read the number bound before the loop (a first step that skips the read),
    which ``.item()`` in the closure could not read."""
    output = _logged_read(assign="if i % 2:\n            D_x = output.mean().item()")
    assert "D_x = output.mean().item()" in output and "{D_x:.4f}" in output


def test_a_host_read_never_read_stays_a_number():
    """No closure reads it: the line is the script's own, a sync for ACC101 to report."""
    output = _logged_read(assign="unread = output.mean().item()")
    assert "unread = output.mean().item()" in output and "D_x = output" not in output
