import libcst as cst

from accrewrite.rule import Example, Rule
from accrewrite.nodes import call_arg
from accrewrite.rules._legacy_types import WORDS, Use, fresh, legacy_types, names_legacy_types
from accrewrite.toolbox import device_here, with_commas

_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


class LegacyTensorTypes(Rule):
    """Make the tensors of legacy CUDA tensor types with a device and a dtype instead.

    Teaching scripts of PyTorch's first years (the GAN collections) choose a type by CUDA's
    availability, `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`, and make
    their labels and noise with it. A legacy type has no spelling for another device, so each
    use is written as a person porting the script writes it, on the device the models go to (the
    script's device variable, else the target's device), with the type's dtype:

    - `Tensor(imgs.size(0), 1)` (sizes: ints, a size, a shape, several arguments) is
      `torch.empty(imgs.size(0), 1, dtype=torch.float32, device=device)`, uninitialised as
      the legacy constructor's tensor is (its `.fill_(1.0)` stays);
    - `Tensor(np.random.normal(...))` (data: a numpy call, a list or tuple written out or built,
      a name every path there assigned one last) is `torch.tensor(..., dtype=torch.float32,
      device=device)`: the draw stays on the host, as before;
    - `imgs.type(Tensor)` is `imgs.to(device, torch.float32)`; `LongTensor` keeps int64,
      `ByteTensor` uint8, and so on; `torch.cuda.FloatTensor(...)` named directly likewise;
    - the alias's assignment goes once every use of it is so written;
    - `Variable(t)` detaches `t` (torch's `Variable` is a detached tensor, `requires_grad` as
      given): it is `t` where `t` has no graph (a constructor's, a factory's, a loader's batch),
      `t.detach()` elsewhere, and `requires_grad=True` is `.requires_grad_()` after it, the
      detach kept unless `t` is made there (a name or a conversion may hold the tensor still).

    Where CUDA is available the script's tensors were on CUDA, as the target's device is
    there; the condition of the alias must be that availability test (`torch.cuda.is_available()`
    or a flag only ever assigned it), since a flag of the script's own could keep the models on
    the host. A type chosen by a tensor's `mu.is_cuda` in a function whose parameter `mu` is
    makes its tensors on `mu.device`. Where a use cannot be so written (a constructor whose one
    argument may be sizes or data, a type passed to a function or compared), the type stays,
    with a diagnostic saying which; on a target whose device is not CUDA, where the type would
    make CUDA tensors, the file is left as it is.
    """

    code = "ACC027"
    name = "legacy-tensor-types"
    summary = "torch.cuda.FloatTensor aliases: Tensor(n, 1), x.type(Tensor), Variable(t) -> tensors made on the device"
    concepts = ("device",)
    triggers = WORDS
    examples = (
        Example(
            before="""
            import numpy as np
            import torch
            from torch.autograd import Variable

            cuda = True if torch.cuda.is_available() else False
            Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
            for imgs, _ in dataloader:
                valid = Variable(Tensor(imgs.size(0), 1).fill_(1.0), requires_grad=False)
                real_imgs = Variable(imgs.type(Tensor))
                z = Variable(Tensor(np.random.normal(0, 1, (imgs.shape[0], 100))))
            """,
            after="""
            import numpy as np
            import torch
            from torch.autograd import Variable
            import accrewrite.runtime.xla_model as xm

            cuda = True if torch.cuda.is_available() else False
            for imgs, _ in dataloader:
                valid = torch.empty(imgs.size(0), 1, dtype=torch.float32, device=xm.xla_device()).fill_(1.0)
                real_imgs = imgs.to(xm.xla_device(), torch.float32)
                z = torch.tensor(np.random.normal(0, 1, (imgs.shape[0], 100)), dtype=torch.float32, device=xm.xla_device())
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import numpy as np
            import torch
            from torch.autograd import Variable

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            LongTensor = torch.cuda.LongTensor if torch.cuda.is_available() else torch.LongTensor

            def sample(generator, n_row):
                labels = np.array([num for _ in range(n_row) for num in range(n_row)])
                labels = Variable(LongTensor(labels))
                noise = torch.cuda.FloatTensor(n_row ** 2, 100).normal_()
                return generator(noise, labels)
            """,
            after="""
            import numpy as np
            import torch
            from torch.autograd import Variable
            import torch_xla

            device = torch_xla.device()

            def sample(generator, n_row):
                labels = np.array([num for _ in range(n_row) for num in range(n_row)])
                labels = torch.tensor(labels, dtype=torch.int64, device=device)
                noise = torch.empty(n_row ** 2, 100, dtype=torch.float32, device=device).normal_()
                return generator(noise, labels)
            """,
            with_rules=("ACC002",),
        ),
        Example(
            target="torch_xla",
            before="""
            import numpy as np
            import torch
            from torch.autograd import Variable

            Tensor = torch.cuda.FloatTensor

            def gradient_penalty(D, real_samples, fake_samples):
                alpha = Tensor(np.random.random((real_samples.size(0), 1, 1, 1)))
                interpolates = Variable(alpha * real_samples + (1 - alpha) * fake_samples, requires_grad=True)
                fake = Variable(Tensor(real_samples.shape[0], 1).fill_(1.0), requires_grad=False)
                return D(interpolates), fake
            """,
            after="""
            import numpy as np
            import torch
            from torch.autograd import Variable
            import torch_xla

            def gradient_penalty(D, real_samples, fake_samples):
                alpha = torch.tensor(np.random.random((real_samples.size(0), 1, 1, 1)), dtype=torch.float32, device=torch_xla.device())
                interpolates = (alpha * real_samples + (1 - alpha) * fake_samples).detach().requires_grad_()
                fake = torch.empty(real_samples.shape[0], 1, dtype=torch.float32, device=torch_xla.device()).fill_(1.0)
                return D(interpolates), fake
            """,
        ),
        Example(
            before="""
            import torch

            Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor

            def noise(values):
                return Tensor(values)
            """,
            diagnostics=("ACC027:3", "ACC027:6"),
        ),
    )

    def applies(self) -> bool:
        return names_legacy_types(self.ctx.facts.file.text)

    def leave_Call(self, original_node, updated_node):
        found = legacy_types(self.ctx)
        use = found.uses.get(original_node)
        if use is not None:
            return self._made_on_device(original_node, updated_node, use)
        if original_node in found.variables:
            return self._unwrapped(original_node, updated_node, found.uses)
        return updated_node

    def _made_on_device(self, original_node: cst.Call, updated_node: cst.Call, use: Use) -> cst.Call:
        dtype = cst.parse_expression(f"torch.{use.dtype}")
        device = cst.parse_expression(use.device) if use.device else device_here(self.ctx)
        if use.kind == "conversion":
            legacy = self.ctx.code(original_node.args[0].value)
            self.ctx.fix(original_node, f".type({legacy}) -> .to(the device, torch.{use.dtype})")
            return updated_node.with_changes(func=updated_node.func.with_changes(attr=cst.Name("to")),
                                             args=with_commas([cst.Arg(device), cst.Arg(dtype)]))
        factory = "empty" if use.kind == "sizes" else "tensor"
        keywords = [cst.Arg(keyword=cst.Name("dtype"), value=dtype, equal=_EQUAL),
                    cst.Arg(keyword=cst.Name("device"), value=device, equal=_EQUAL)]
        made = f"torch.{factory}(..., dtype=torch.{use.dtype}, device=...)"
        self.ctx.fix(original_node, f"{self.ctx.code(original_node.func)}(...) -> {made}")
        return updated_node.with_changes(func=cst.parse_expression(f"torch.{factory}"),
                                         args=with_commas([*updated_node.args, *keywords]))

    def _unwrapped(self, original_node: cst.Call, updated_node: cst.Call, uses) -> cst.Call:
        """``Variable(t, requires_grad=r)`` is ``t.detach().requires_grad_(r)``: the detach left out
        where ``t`` has no graph (and, where ``r`` is given, is a tensor made there, which no name
        holds), the ``requires_grad_`` where ``r`` is absent or False."""
        args = {arg.keyword.value if arg.keyword else index: arg for index, arg in enumerate(updated_node.args)}
        data = args.pop(0, None) or args.pop("data", None)
        grad = args.pop("requires_grad", None)
        if data is None or args or data.star:
            return updated_node
        wants_grad = grad is not None and not (type(grad.value) is cst.Name and grad.value.value == "False")
        value, shown = data.value, "t"
        if not fresh(self.ctx, call_arg(original_node, 0, "data").value, uses, made=wants_grad):
            value, shown = cst.Call(cst.Attribute(_parenthesized(value), cst.Name("detach"))), "t.detach()"
        if wants_grad:
            given = [] if type(grad.value) is cst.Name and grad.value.value == "True" else [cst.Arg(grad.value)]
            value = cst.Call(cst.Attribute(_parenthesized(value), cst.Name("requires_grad_")), given)
            shown += ".requires_grad_()"
        self.ctx.fix(original_node, f"Variable(t) -> {shown}: a Variable is a detached tensor")
        return value.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar) if not value.lpar else value

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if original_node in legacy_types(self.ctx).aliases:
            self.ctx.fix(original_node, "the legacy tensor type's alias goes: its tensors are made on the device")
            return cst.RemoveFromParent()
        return updated_node

    def visit_Module(self, node: cst.Module) -> None:
        """What stays is reported once per file; where the target's device is not CUDA, the legacy
        type would make CUDA tensors beside the target's, and the file stays as it is."""
        left = legacy_types(self.ctx).left
        if not left:
            return
        stays = self.ctx.target.has("accelerator_available")
        for where, message, help in left:
            if stays:
                self.ctx.refuse(where, f"{message}; file left as it is", help)
            else:
                self.ctx.diagnose(where, message, help)


def _parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` ready for a method call: an operation in parentheses."""
    if type(node) in (cst.BinaryOperation, cst.UnaryOperation, cst.BooleanOperation, cst.Comparison, cst.IfExp) \
            and not node.lpar:
        return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return node
