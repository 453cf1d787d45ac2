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
