"""``accrewrite.runtime.accelerator``, the public name of the device layer, is the module
``accrewrite.base.accelerator`` itself (one module, so that its state and a test's patches are
shared with the kernels that read it)."""

import sys

from accrewrite.base import accelerator

sys.modules[__name__] = accelerator
