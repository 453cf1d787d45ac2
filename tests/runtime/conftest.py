import pytest


@pytest.fixture
def fresh_compiles():
    """Every compile traces anew: no on-disk cache hit, no dynamo cache left by another test."""
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()
