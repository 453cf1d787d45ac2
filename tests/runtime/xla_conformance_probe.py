"""Reads one implementation of the torch_xla API and prints what it found as JSON.

    python xla_conformance_probe.py torch_xla   # in an environment with torch_xla 2.9
    python xla_conformance_probe.py runtime     # with accrewrite.runtime

It prints the signature of every public name of each surface, and the result of every
behaviour case run on that implementation. tests/runtime/test_xla_conformance.py runs it once
per implementation and compares the two outputs. Each case uses only calls that both
implementations offer, so the same code runs on both.
"""

import importlib
import inspect
import io
import json
import os
import sys
import tempfile
import threading
import types

import torch

# surface -> (torch_xla module, accrewrite.runtime module)
SURFACES = {
    "xla_model": ("torch_xla.core.xla_model", "accrewrite.runtime.xla_model"),
    "parallel_loader": ("torch_xla.distributed.parallel_loader", "accrewrite.runtime.parallel_loader"),
    "amp": ("torch_xla.amp", "accrewrite.runtime.amp"),
    "amp.syncfree": ("torch_xla.amp.syncfree", "accrewrite.runtime.amp.syncfree"),
    "distributed.xla_backend": ("torch_xla.distributed.xla_backend", "accrewrite.runtime.distributed.xla_backend"),
    "distributed.xla_multiprocessing": ("torch_xla.distributed.xla_multiprocessing",
                                        "accrewrite.runtime.distributed.xla_multiprocessing"),
    "runtime": ("torch_xla.runtime", "accrewrite.runtime.xla_runtime"),
}
PRIVATE_BUT_EMITTED = {"_fetch_gradients"}  # the torchacc target calls it


# --- signatures --------------------------------------------------------------------------


def _default(value):
    if value is inspect.Parameter.empty:
        return {"empty": True}
    if value is sys.stdout:
        return {"object": "sys.stdout"}
    try:
        json.dumps(value)
        return {"value": value}
    except TypeError:
        return {"object": repr(value)}


def _signature(obj):
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name, _default(p.default)] for p in signature.parameters.values()]


def _owned(module, obj):
    """Whether ``obj`` is the module's own: a constant, or defined in it (in a package, in one
    of its submodules), not a module or a name it imported."""
    if inspect.ismodule(obj):
        return False
    owner = getattr(obj, "__module__", None)
    if owner is None:
        return True
    return owner == module.__name__ or (hasattr(module, "__path__") and owner.startswith(module.__name__ + "."))


def _members(cls, package):
    """Public methods and properties that ``cls`` or its bases in ``package`` define, leaving
    out those that override a method of a base from elsewhere (torch.optim's)."""
    methods, properties = {}, []
    foreign = set().union(*(vars(k) for k in cls.__mro__ if not k.__module__.startswith(package)))
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith(package):
            continue
        for attr, member in vars(klass).items():
            if attr.startswith("_") or attr in foreign:
                continue
            if isinstance(member, property):
                properties.append(attr)
            elif callable(member):
                methods[attr] = _signature(member)
    return methods, sorted(set(properties))


def describe(module):
    package = module.__name__.split(".")[0]
    names = {}
    for name in sorted(vars(module)):
        if name.startswith("_") and name not in PRIVATE_BUT_EMITTED:
            continue
        obj = getattr(module, name)
        if not _owned(module, obj):
            continue
        if inspect.isclass(obj):
            methods, properties = _members(obj, package)
            names[name] = {"kind": "class", "signature": _signature(obj), "methods": methods,
                           "properties": properties}
        elif callable(obj):
            names[name] = {"kind": "function", "signature": _signature(obj)}
        elif isinstance(obj, (str, int, float, bool)):
            names[name] = {"kind": "constant", "value": obj}
    return names


# --- the implementation under test -------------------------------------------------------


def load(impl):
    """A namespace with the modules of ``impl`` under the names the cases use."""
    index = 0 if impl == "torch_xla" else 1
    api = types.SimpleNamespace(
        **{surface.replace(".", "_"): importlib.import_module(paths[index])
           for surface, paths in SURFACES.items()}
    )
    api.xm = api.xla_model
    api.pl = api.parallel_loader
    api.syncfree = api.amp_syncfree
    if impl == "torch_xla":
        import torch_xla

        api.device = torch_xla.device()
        # torch_xla 2.9 has no amp.GradScaler; torch's own runs on the XLA device.
        api.grad_scaler = lambda **kwargs: torch.amp.GradScaler("xla", **kwargs)
    else:
        api.device = api.xm.xla_device()
        api.grad_scaler = api.amp.GradScaler
    return api


def _values(tensors):
    return [t.detach().cpu().tolist() for t in tensors]


def _errors(calls):
    """The type of the exception each call raises, or "returned"."""
    out = {}
    for label, call in calls.items():
        try:
            call()
            out[label] = "returned"
        except Exception as error:  # noqa: BLE001 - the type is the result
            out[label] = type(error).__name__
    return out


def _result(result, source):
    return {"values": _values([result])[0], "shape": list(result.shape), "dtype": str(result.dtype),
            "is_input": result is source}


# --- behaviour cases: each returns JSON-able results ---------------------------------------

CASES = {}


def case(function):
    CASES[function.__name__] = function
    return function


@case
def all_reduce_tensor(api):
    t = torch.tensor([1.0, 2.0, 4.0], device=api.device)
    out = {}
    for label, kwargs in {
        "plain": {},
        "scaled": {"scale": 0.5},
        "groups": {"groups": [[0]]},
        "scaled_groups": {"scale": 0.25, "groups": [[0]], "pin_layout": False},
    }.items():
        result = api.xm.all_reduce(api.xm.REDUCE_SUM, t, **kwargs)
        out[label] = {"result": _values([result])[0], "is_input": result is t, "input": _values([t])[0]}
    return out


@case
def all_reduce_list(api):
    out = {}
    for container in (list, tuple):
        ts = container([torch.tensor([1.0, -2.0], device=api.device), torch.tensor([3.0], device=api.device)])
        result = api.xm.all_reduce(api.xm.REDUCE_SUM, ts, scale=0.5)
        out[container.__name__] = {"is_input": result is ts, "values": _values(result), "inputs": _values(ts)}
    return out


@case
def all_reduce_reduce_types(api):
    out = {}
    for name in ("REDUCE_SUM", "REDUCE_MUL", "REDUCE_AND", "REDUCE_OR", "REDUCE_MIN", "REDUCE_MAX"):
        reduce_type = getattr(api.xm, name)
        t = torch.tensor([0, 1, 3], dtype=torch.int32, device=api.device)
        out[name] = {"value": reduce_type, "result": _values([api.xm.all_reduce(reduce_type, t)])[0]}
    return out


def _matrix(api):
    return torch.arange(6.0).reshape(2, 3).to(api.device)


@case
def all_gather(api):
    t = _matrix(api)
    out = {label: _result(api.xm.all_gather(t, **kwargs), t) for label, kwargs in {
        "plain": {}, "dim": {"dim": 1}, "negative_dim": {"dim": -1, "pin_layout": False},
        "groups": {"groups": [[0]]}, "groups_unpinned": {"groups": [[0]], "pin_layout": False},
    }.items()}
    output = torch.zeros(2, 3, device=api.device)
    out["output"] = {"is_output": api.xm.all_gather(t, output=output) is output, "values": _values([output])}
    ts = [t, t + 1]
    gathered = api.xm.all_gather(ts, dim=1, pin_layout=False)
    out["list"] = {"values": _values(gathered), "is_input": gathered is ts}
    outputs = [torch.zeros(2, 3, device=api.device) for _ in ts]
    out["list_output"] = {"is_output": api.xm.all_gather(ts, output=outputs, pin_layout=False) is outputs,
                          "values": _values(outputs)}
    out["errors"] = _errors({"list_pinned": lambda: api.xm.all_gather(ts),
                             "not_a_tensor": lambda: api.xm.all_gather(3.0),
                             "tuple": lambda: api.xm.all_gather(tuple(ts), pin_layout=False)})
    return out


@case
def reduce_scatter(api):
    t = _matrix(api)
    integers = torch.arange(4).to(api.device)
    out = {label: _result(api.xm.reduce_scatter(*args, **kwargs), args[1]) for label, (args, kwargs) in {
        "plain": ((api.xm.REDUCE_SUM, t, 1.0, 0, 1), {}),
        "scaled_dim": ((api.xm.REDUCE_SUM, t, 0.5, 1, 1), {}),
        "max_scaled": ((api.xm.REDUCE_MAX, t, 0.5, 1, 1), {}),
        "two_shards": ((api.xm.REDUCE_SUM, t, 0.5, 0, 2), {}),
        "groups": ((api.xm.REDUCE_SUM, t, 2.0, 0, 1), {"groups": [[0]], "pin_layout": False}),
        "integers": ((api.xm.REDUCE_SUM, integers, 1.0, 0, 1), {}),
    }.items()}
    output = torch.zeros(2, 3, device=api.device)
    returned = api.xm.reduce_scatter(api.xm.REDUCE_SUM, t, 2.0, 0, 1, output=output)
    out["output"] = {"is_output": returned is output, "values": _values([output])}
    # torch_xla 2.9 aborts the process on a list with pin_layout=True: lists go unpinned here
    ts = [t, t + 1]
    scattered = api.xm.reduce_scatter(api.xm.REDUCE_SUM, ts, 2.0, 1, 1, pin_layout=False)
    out["list"] = {"values": _values(scattered), "is_input": scattered is ts, "inputs": _values(ts)}
    outputs = [torch.zeros(2, 3, device=api.device) for _ in ts]
    returned = api.xm.reduce_scatter(api.xm.REDUCE_SUM, ts, 1.0, 0, 1, output=outputs, pin_layout=False)
    out["list_output"] = {"is_output": returned is outputs, "values": _values(outputs)}
    out["errors"] = _errors({"not_a_tensor": lambda: api.xm.reduce_scatter(api.xm.REDUCE_SUM, 3.0, 1.0, 0, 1)})
    return out


@case
def all_to_all(api):
    t = _matrix(api)
    return {label: _result(api.xm.all_to_all(t, *args, **kwargs), t) for label, (args, kwargs) in {
        "same_dimension": ((0, 0, 1), {}),
        "split_columns": ((1, 0, 1), {}),
        "groups": ((0, 1, 1), {"groups": [[0]], "pin_layout": False}),
    }.items()}


@case
def collective_permute(api):
    t = _matrix(api)
    return {"to_itself": _result(api.xm.collective_permute(t, [[0, 0]]), t),
            "no_pairs": _result(api.xm.collective_permute(t, []), t)}


def _model_and_optimizer(api, optimizer_class=torch.optim.SGD, **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(api.device)
    optimizer = optimizer_class(model.parameters(), lr=0.1, **kwargs)
    x = torch.arange(6.0).reshape(2, 3).to(api.device)
    model(x).square().sum().backward()
    return model, optimizer


@case
def reduce_gradients(api):
    model, optimizer = _model_and_optimizer(api)
    before = _values([p.grad for p in model.parameters()])
    api.xm.reduce_gradients(optimizer)
    fetched = api.xm._fetch_gradients(optimizer)
    return {"unchanged": _values([p.grad for p in model.parameters()]) == before,
            "fetched": len(fetched)}


@case
def optimizer_step(api):
    out = {}
    for barrier in (False, True):
        model, optimizer = _model_and_optimizer(api)
        ran = []
        api.xm.add_step_closure(lambda: ran.append("closure"))
        result = api.xm.optimizer_step(optimizer, barrier=barrier)
        out[f"barrier={barrier}"] = {"closure_ran": ran == ["closure"], "returned": result,
                                     "weight": _values([model.weight])[0]}
        api.xm.mark_step()  # runs what the step left
    model, optimizer = _model_and_optimizer(api, torch.optim.LBFGS)
    result = api.xm.optimizer_step(
        optimizer, optimizer_args={"closure": lambda: torch.tensor(7.0, device=api.device)}
    )
    out["optimizer_args"] = float(result)
    api.xm.mark_step()
    return out


@case
def step_closures(api):
    order = []
    done = threading.Event()
    api.xm.add_step_closure(order.append, args=("sync 1",))
    api.xm.add_step_closure(lambda: order.append("async 1"), run_async=True)
    api.xm.add_step_closure(order.append, ("sync 2",))
    api.xm.add_step_closure(done.set, run_async=True)
    before_mark = list(order)
    api.xm.mark_step()
    done.wait(30)
    return {"before_mark": before_mark, "sync_after_mark": [o for o in order if o.startswith("sync")],
            "async_after_mark": [o for o in order if o.startswith("async")]}


@case
def mark_step(api):
    ran = []
    api.xm.add_step_closure(lambda: ran.append(1))
    api.xm.mark_step(wait=True)
    api.xm.mark_step()  # nothing queued
    api.xm.wait_device_ops()
    return ran


@case
def save(api):
    data = {"w": torch.ones(2, device=api.device), "step": 3}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, kwargs in {"default": {}, "master_only=False": {"master_only": False},
                              "global_master": {"global_master": True}}.items():
            path = os.path.join(tmp, f"{label}.pt")
            api.xm.save(data, path, **kwargs)
            loaded = torch.load(path)
            out[label] = {"written": os.path.exists(path),
                          "device": loaded["w"].device.type, "w": loaded["w"].tolist(), "step": loaded["step"]}
        buffer = io.BytesIO()
        api.xm.save(data, buffer)
        buffer.seek(0)
        out["file_object"] = torch.load(buffer)["w"].tolist()
    return out


@case
def rendezvous(api):
    ran = []
    api.xm.add_step_closure(lambda: ran.append(1))
    out = {"payloads": [p.hex() for p in api.xm.rendezvous("probe", b"abc")],
           "empty": [p.hex() for p in api.xm.rendezvous("probe")],
           "all_replicas": [p.hex() for p in api.xm.rendezvous("probe", b"x", [0])],
           "marks_the_step": ran == [1]}
    out.update(_errors({"text_payload": lambda: api.xm.rendezvous("probe", "abc"),
                        "foreign_replicas": lambda: api.xm.rendezvous("probe", b"", [0, 1])}))
    return out


@case
def mesh_reduce(api):
    ran = []
    api.xm.add_step_closure(lambda: ran.append(1))
    t = torch.tensor([1.0, 2.0], device=api.device)
    return {"float": api.xm.mesh_reduce("probe", 0.5, sum),
            "marks_the_step": ran == [1],
            "nested": api.xm.mesh_reduce("probe", {"a": 1, "b": [2, (3, "c")]}, lambda datas: datas),
            "none": api.xm.mesh_reduce("probe", None, lambda datas: datas),
            "tensor": api.xm.mesh_reduce("probe", {"t": t}, lambda datas: [(d["t"].device.type, d["t"].tolist())
                                                                           for d in datas])}


@case
def ordinals(api):
    return {"local_master": api.xm.is_master_ordinal(), "global_master": api.xm.is_master_ordinal(local=False),
            "local_ordinal": api.xm.get_local_ordinal(), "runtime_world_size": api.runtime.world_size(),
            "runtime_global_ordinal": api.runtime.global_ordinal(),
            "runtime_local_ordinal": api.runtime.local_ordinal(),
            "runtime_process_count": api.runtime.process_count(),
            "runtime_process_index": api.runtime.process_index(),
            "runtime_local_process_count": api.runtime.local_process_count()}


@case
def rng_state(api):
    api.xm.set_rng_state(1234)
    after_set = api.xm.get_rng_state()
    torch.rand(3, device=api.device).sum().item()
    api.xm.mark_step()
    state = api.xm.get_rng_state()
    first = torch.rand(3, device=api.device).tolist()
    api.xm.set_rng_state(state)
    again = torch.rand(3, device=api.device).tolist()
    api.xm.set_rng_state(99, device=str(api.device))
    return {"after_set": after_set, "moved_on_after_a_draw": state != after_set,
            "is_int": isinstance(state, int), "set_of_get_restores_the_stream": first == again,
            "after_set_on_device": api.xm.get_rng_state(str(api.device))}


def _batches(n=5):
    return [(torch.full((2,), float(i)), {"label": torch.tensor(i)}) for i in range(n)]


@case
def device_loader(api):
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=2)
    device_loader = api.pl.MpDeviceLoader(loader, api.device)
    first = [batch.tolist() for batch in device_loader]
    partial = []
    for batch in device_loader:
        partial.append(batch.tolist())
        if len(partial) == 2:
            break
    again = [batch.tolist() for batch in device_loader]
    on_device = all(batch.device == torch.device(api.device) for batch in device_loader)
    nested = next(iter(api.pl.MpDeviceLoader(_batches(), api.device)))
    return {"len": len(device_loader), "first": first, "partial": partial, "again": again,
            "on_device": on_device, "nested": [nested[0].tolist(), nested[1]["label"].item()]}


@case
def parallel_loader(api):
    parallel = api.pl.ParallelLoader(_batches(), [api.device])
    per_device = parallel.per_device_loader(api.device)
    out = {"per_device_samples": parallel.per_device_samples(), "len": len(per_device),
           "batches_per_execution": parallel.batches_per_execution,
           "values": [batch[1]["label"].item() for batch in per_device]}
    parallel.close()
    return out


@case
def batches_per_execution(api):
    """Which closures have run after each fetch: a closure queued before each fetch records
    its fetch, so a mark of the step during fetch k shows k in that fetch's list."""
    out = {}
    for every in (1, 2, 3):
        ran, seen = [], []
        iterator = iter(api.pl.MpDeviceLoader(_batches(7), api.device, batches_per_execution=every))
        for fetch in range(8):
            api.xm.add_step_closure(ran.append, args=(fetch,))
            try:
                next(iterator)
            except StopIteration:
                break
            finally:
                seen.append(list(ran))
        out[str(every)] = seen
        api.xm.mark_step()
    return out


def _scaled_steps(api, optimizer_class):
    """Three GradScaler steps, the first with an inf gradient."""
    model, optimizer = _model_and_optimizer(api, optimizer_class)
    scaler = api.grad_scaler(init_scale=4.0)
    start = _values(model.parameters())
    x = torch.arange(6.0).reshape(2, 3).to(api.device)
    results = {}
    for step, poison in enumerate((True, False, False)):
        optimizer.zero_grad()
        scaler.scale(model(x).square().mean()).backward()
        if poison:
            model.bias.grad[0] = float("inf")
        scaler.step(optimizer)
        scaler.update()
        results[f"step {step}"] = {"scale": float(scaler.get_scale()), "params": _values(model.parameters())}
    results["overflow step kept the parameters"] = results["step 0"]["params"] == start
    return results


def _found_inf_steps(api, optimizer_class):
    """Steps told by ``found_inf`` whether to skip, from the first step on."""
    model, optimizer = _model_and_optimizer(api, optimizer_class)
    x = torch.arange(6.0).reshape(2, 3).to(api.device)
    results = {}
    for step, found_inf in enumerate((1.0, 0.0, 1.0, 0.0)):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step(found_inf=torch.tensor(found_inf, device=api.device))
        results[f"step {step} found_inf={found_inf}"] = _values(model.parameters())
    return results


@case
def syncfree_grad_scaler(api):
    return {name: _scaled_steps(api, getattr(api.syncfree, name)) for name in ("SGD", "Adam", "AdamW")}


@case
def syncfree_found_inf(api):
    return {name: _found_inf_steps(api, getattr(api.syncfree, name)) for name in ("SGD", "Adam", "AdamW")}


def main():
    impl = sys.argv[1]
    api = load(impl)
    surfaces = {surface: describe(getattr(api, surface.replace(".", "_"))) for surface in SURFACES}
    results = {}
    for name, function in CASES.items():
        try:
            results[name] = {"result": function(api)}
        except Exception as error:  # noqa: BLE001 - a failing case is a result to compare
            results[name] = {"error": f"{type(error).__name__}: {error}"}
    api.xm.mark_step()
    json.dump({"surfaces": surfaces, "cases": results}, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
