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
