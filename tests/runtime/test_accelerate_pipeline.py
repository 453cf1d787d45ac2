"""``accelerate`` on models that hold parameters of their own at the top (``_parallel_models.py``:
a GPT's positional embedding, a ViT's ``cls_token`` and ``pos_embed``), on real gloo processes:
tensor parallel, pipeline parallel and their combinations with FSDP train as one process does
on the same global batch: 10 SGD steps, losses and final parameters within 1e-5; so does context
parallel (Ulysses over causal ``scaled_dot_product_attention``, ``nn.MultiheadAttention``
causal or not, a Llama's rotary table cut with the sequence), alone, with activation
checkpointing and with FSDP; and ring attention, alone, with Ulysses (``mode = "2d"``) and with
FSDP, over SDPA causal or not and causal ``nn.MultiheadAttention``. In one process: how a model
is cut into stages, and how ``config.dist.topology`` lays the parallelisms over the ranks.
"""

import operator
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from accrewrite.runtime import Config, accelerate
from accrewrite.runtime.parallel import apply
from accrewrite.runtime.parallel.apply import find_layers
from accrewrite.runtime.parallel.config import PipelineParallelConfig
from accrewrite.runtime.parallel.parallel_dims import ParallelDims
from accrewrite.runtime.parallel.pipeline import _micro_batch_weights, split_point_names, split_stages

import _parallel_models as models
from _ranks import run_ranks
from _tp_layouts import split_packed_attention


def _data_parallel_mean(loss, mesh):
    """The loss averaged over the ranks that read different batches."""
    loss = loss.detach().clone()
    if mesh is not None:
        dist.all_reduce(loss)
        loss /= dist.get_world_size()
    return loss.item()


def _pipeline_step(model, inputs):
    # given as views, as tokens[:, 1:] is: the targets carried to the last stage are sent strided
    return model.forward_backward(*(torch.cat([t, t], -1)[..., :t.shape[-1]] for t in inputs))


def _accelerated_rank(rank, cases):
    results = []
    for name, sizes, *settings in cases:
        config = Config()
        for section, size in sizes.items():
            getattr(config.dist, section).size = size
        for path, value in (settings[0] if settings else {}).items():  # {"dist.topology": [...]}
            section, field = path.rsplit(".", 1)
            setattr(operator.attrgetter(section)(config), field, value)
        config.dist.pp.num_micro_batches = 2
        data_ranks = int(os.environ["WORLD_SIZE"]) // (sizes.get("tp", 1) * sizes.get("pp", 1) * sizes.get("sp", 1))
        model, loader = accelerate(models.build(name), models.loader(name, models.GLOBAL_BATCH // data_ranks), config)
        losses = models.train(model, loader, _pipeline_step if "pp" in sizes else models.backward_step)
        losses = [_data_parallel_mean(loss, model.accelerate_mesh) for loss in losses]
        evaluate = model.forward if "pp" in sizes else model  # a pipeline's, as TorchAcc spells it
        with torch.no_grad():
            evaluated = _data_parallel_mean(evaluate(*next(iter(loader))), model.accelerate_mesh)
        results.append((losses, get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)), evaluated))
    return results


def _assert_matches(rank_results, name):
    """Every rank's losses are one process's; the stages' parameters together are its own."""
    want_losses, want_state, want_evaluated = models.reference(name)
    # tensor parallel splits nn.MultiheadAttention's packed q/k/v into projections
    want_state = split_packed_attention(want_state)
    state = {}
    for losses, stage_state, evaluated in rank_results:
        assert losses == pytest.approx(want_losses, abs=1e-5)
        assert evaluated == pytest.approx(want_evaluated, abs=1e-5)
        state.update(split_packed_attention(stage_state))
    assert state.keys() == want_state.keys()
    for key, value in want_state.items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=1e-5, msg=key)


def _run(cases, ranks):
    per_rank = run_ranks(_accelerated_rank, ranks, cases)
    for index, (name, *_) in enumerate(cases):
        _assert_matches([results[index] for results in per_rank], name)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_tensor_parallel_splits_models_with_parameters_of_their_own():
    _run([("gpt", {"tp": 2}), ("vit", {"tp": 2})], 2)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_pipeline_parallel_over_two_ranks_matches_one_process():
    _run([("gpt", {"pp": 2}), ("llama", {"pp": 2}), ("vit", {"pp": 2})], 2)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_pipeline_with_fsdp_or_tensor_parallel_over_four_ranks_matches_one_process():
    pipeline_neighbours = ["tp", "dp", "fsdp", "pp"]
    _run([("gpt", {"fsdp": 2, "pp": 2}), ("llama", {"fsdp": 2, "pp": 2}), ("vit", {"fsdp": 2, "pp": 2}),
          ("gpt", {"tp": 2, "pp": 2}), ("llama", {"tp": 2, "pp": 2}), ("vit", {"tp": 2, "pp": 2}),
          ("gpt", {"tp": 2, "pp": 2}, {"dist.topology": pipeline_neighbours})], 4)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_pipeline_fsdp_and_tensor_parallel_over_eight_ranks_match_one_process():
    _run([("gpt", {"fsdp": 2, "tp": 2, "pp": 2}), ("llama", {"fsdp": 2, "tp": 2, "pp": 2}),
          ("vit", {"fsdp": 2, "tp": 2, "pp": 2})], 8)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_context_parallel_over_two_ranks_matches_one_process():
    _run([("gpt", {"sp": 2}), ("gpt_mha", {"sp": 2}), ("llama", {"sp": 2}), ("vit", {"sp": 2}),
          ("gpt", {"sp": 2}, {"memory.gc": True})], 2)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_context_parallel_with_fsdp_over_four_ranks_matches_one_process():
    _run([("gpt", {"fsdp": 2, "sp": 2}), ("llama", {"fsdp": 2, "sp": 2}), ("vit", {"fsdp": 2, "sp": 2})], 4)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_ring_attention_over_two_ranks_matches_one_process():
    ring = {"dist.sp.mode": "ring"}
    _run([("gpt", {"sp": 2}, ring), ("gpt_encoder", {"sp": 2}, ring), ("gpt_mha", {"sp": 2}, ring),
          ("llama", {"sp": 2}, ring), ("gpt", {"sp": 2}, {**ring, "memory.gc": True})], 2)


# -- a loss computed outside the model: output_fn given the targets -------------------------------

# Losses whose mean over the micro-batches is not the batch's: tokens ignored unevenly, classes
# weighed, a sum (its steps as small as a mean's); and torch's function, called as the model's
# output's criterion. Each with its learning rate.
CRITERIA = {
    "mean over kept tokens": (lambda: torch.nn.CrossEntropyLoss(), 0.1),
    "weighed classes, smoothed": (lambda: torch.nn.CrossEntropyLoss(
        weight=torch.linspace(0.5, 2, models.VOCAB), label_smoothing=0.1), 0.1),
    "sum": (lambda: torch.nn.CrossEntropyLoss(reduction="sum"), 0.1 / (models.GLOBAL_BATCH * models.CONTEXT)),
    "function": (lambda: torch.nn.functional.cross_entropy, 0.1),
}


def _ignoring_loader():
    """The GPT's batches with about a third of the targets ignored (-100), unevenly over the
    micro-batches."""
    tokens, targets = models.dataset("gpt").tensors
    targets = targets.masked_fill(torch.rand(targets.shape, generator=torch.Generator().manual_seed(2)) < 0.3, -100)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens, targets), batch_size=models.GLOBAL_BATCH)


def _criterion_rank(rank, names):
    results = []
    for name in names:
        make, lr = CRITERIA[name]
        criterion = make()
        config = Config()
        config.dist.pp.size = config.dist.pp.num_micro_batches = 2
        model = accelerate(models.build("gpt_logits"), config=config)
        losses = models.train(model, _ignoring_loader(), lambda model, inputs: model.forward_backward(
            inputs[0], output_fn=criterion, target=inputs[1]), lr)
        tokens, targets = next(iter(_ignoring_loader()))
        evaluated = model.forward(tokens, output_fn=criterion, target=targets)
        results.append(([loss.item() for loss in losses], model.state_dict(), evaluated.item()))
    return results


def _criterion_reference(name):
    make, lr = CRITERIA[name]
    criterion = make()
    model = models.build("gpt_logits")

    def step(model, inputs):
        loss = criterion(model(inputs[0]), inputs[1])
        loss.backward()
        return loss.detach().item()

    losses = models.train(model, _ignoring_loader(), step, lr)
    tokens, targets = next(iter(_ignoring_loader()))
    with torch.no_grad():
        return losses, model.state_dict(), criterion(model(tokens), targets).item()


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_ulysses_within_groups_and_a_ring_across_them_or_ring_with_fsdp_over_four_ranks_match_one_process():
    two_d = {"dist.sp.mode": "2d", "dist.sp.ulysses_size": 2}
    _run([("gpt", {"sp": 4}, two_d), ("gpt_encoder", {"sp": 4}, two_d), ("gpt_mha", {"sp": 4}, two_d),
          ("gpt", {"fsdp": 2, "sp": 2}, {"dist.sp.mode": "ring"})], 4)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_a_loss_outside_the_model_given_the_targets_trains_as_one_process():
    names = list(CRITERIA)
    per_rank = run_ranks(_criterion_rank, 2, names)
    for index, name in enumerate(names):
        want_losses, want_state, want_evaluated = _criterion_reference(name)
        state = {}
        for losses, stage_state, evaluated in (results[index] for results in per_rank):
            assert losses == pytest.approx(want_losses, rel=1e-5, abs=1e-5), name
            assert evaluated == pytest.approx(want_evaluated, rel=1e-5, abs=1e-5), name
            state.update(stage_state)
        assert state.keys() == want_state.keys()
        for key, value in want_state.items():
            torch.testing.assert_close(state[key], value, rtol=0, atol=1e-5, msg=f"{name}: {key}")


def test_a_loss_of_one_value_per_sample_is_refused_as_the_pipelines_loss():
    with pytest.raises(ValueError, match=r"CrossEntropyLoss has reduction='none', but a micro-batch's loss must be "
                                         r"one value: give reduction 'mean' or 'sum'"):
        _micro_batch_weights(torch.nn.CrossEntropyLoss(reduction="none"), [{"target": torch.zeros(2)}] * 2, 2)


# -- one process: stages and topology ------------------------------------------------------------


def _stages(model, **pp):
    layers = find_layers(model, None, "config.dist.fsdp.wrap_layer_cls")
    pp = PipelineParallelConfig(**pp)
    return split_stages(model, split_point_names(model, pp, layers), layers, pp.input_names)


def _through(stages, inputs):
    values = inputs
    for stage in stages:
        values = stage(*values)
        values = values if isinstance(values, tuple) else (values,)
    return values[0]


@pytest.mark.parametrize("name, size", [("gpt", 3), ("llama", 2), ("vit", 4)])
def test_stages_run_one_after_the_other_compute_the_forward_and_share_its_parameters(name, size):
    model = models.build(name)
    stages = _stages(model, size=size)
    inputs = models.dataset(name)[:4]
    assert torch.equal(_through(stages, inputs), model(*inputs))
    held = [id(param) for stage in stages for param in stage.parameters()]
    assert sorted(held) == sorted(id(param) for param in model.parameters())  # each in one stage, none copied


def test_the_blocks_are_shared_evenly_the_first_stages_taking_one_more():
    model = models.build("gpt")
    layers = find_layers(model, None, "")
    assert split_point_names(model, PipelineParallelConfig(size=3), layers) == ["h.2", "h.3"]
    assert split_point_names(model, PipelineParallelConfig(size=2, split_points=[model.h[1]]), layers) == ["h.1"]
    first, last = _stages(model, size=2, split_points=["h.3"])
    assert {key.split(".")[0] for key in first.state_dict()} == {"wte", "pos", "h"}
    assert {key.split(".")[0] for key in last.state_dict()} == {"h", "ln_f", "lm_head"}


@pytest.mark.parametrize(
    "pp, message",
    [
        ({"size": 2, "split_points": ["h.9"]}, r"split_points names 'h.9', which is not a module of GPT"),
        ({"size": 3, "split_points": ["h.1"]}, r"gives 1 points for config.dist.pp.size = 3 stages; give 2"),
        ({"size": 3, "split_points": ["h.3", "h.1"]}, r"not in the order GPT's forward calls them"),
        ({"size": 2, "split_points": ["h.1.attn"]}, r"\['h.1.attn'\] are not called by GPT's forward"),
        ({"size": 5}, r"GPT has 4 repeated blocks, too few for config.dist.pp.size = 5 stages"),
    ],
)
def test_split_points_that_do_not_cut_the_forward_say_what_to_give(pp, message):
    with pytest.raises(ValueError, match=message):
        _stages(models.build("gpt"), **pp)


def test_a_split_point_called_twice_is_not_one_place_to_cut():
    class Twice(models.GPT):
        def forward(self, tokens, targets):
            x = self.wte(tokens) + self.pos
            for block in (*self.h, self.h[1]):
                x = block(x)
            return torch.nn.functional.cross_entropy(self.lm_head(self.ln_f(x)).flatten(0, 1), targets.flatten())

    with pytest.raises(ValueError, match=r"\['h.1'\] are called more than once by Twice's forward"):
        _stages(Twice(), size=2, split_points=["h.1"])


def test_a_parameter_read_by_two_stages_is_an_error_not_two_parameters():
    model = models.build("gpt")
    model.lm_head.weight = model.wte.weight  # tied embeddings
    with pytest.raises(ValueError, match=r"GPT.wte.weight is read by pipeline stages \[0, 1\] \(tied weights\?\)"):
        _stages(model, size=2)


def test_input_names_trace_arguments_with_a_default_as_inputs():
    class OptionalTargets(models.GPT):
        def forward(self, tokens, targets=None):
            return super().forward(tokens, targets)

    model = OptionalTargets()
    tokens, targets = models.dataset("gpt")[:4]
    with pytest.raises(ValueError, match=r"\(AttributeError: 'NoneType' object .*give config.dist.pp.input_names"):
        _stages(model, size=2)  # targets fixed to None while tracing
    stages = _stages(model, size=2, input_names=["tokens", "targets"])
    assert torch.equal(_through(stages, (tokens, targets)), model(tokens, targets))


def test_a_forward_that_cannot_be_traced_asks_for_its_inputs_or_traceable_code():
    class Branching(models.GPT):
        def forward(self, tokens, targets):
            return super().forward(tokens, targets) if tokens.sum() > 0 else None

    with pytest.raises(ValueError, match=r"traces Branching's forward with torch.fx, which failed .*input_names"):
        _stages(Branching(), size=2)


@pytest.mark.parametrize(
    "micro, message",
    [(0, "num_micro_batches must be a positive int, got 0"),
     (1, r"num_micro_batches = 1 is fewer than the config.dist.pp.size = 2 stages, which the 1F1B schedule needs")],
)
def test_too_few_micro_batches_for_the_stages_say_how_many_to_give(micro, message):
    config = Config()
    config.dist.pp.size, config.dist.pp.num_micro_batches = 2, micro
    dims = ParallelDims.from_config(config, 2)
    with pytest.raises(ValueError, match=message):
        for part in apply.PARTS:
            part.check(config, dims)


def _group_ranks(topology, rank, **sizes):
    """The ranks of each dim's group of ``rank`` in an 8-rank mesh of ``topology``."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=8)
    try:
        dims = ParallelDims(world_size=8, topology=topology, **sizes)
        mesh = dims.build_mesh("cpu")
        groups = {name: mesh[name].mesh.tolist() for name in topology}
        if dims.sp_enabled:
            groups["shard"] = dims.shard_mesh.mesh.tolist()
        return dims.shape, groups, dims.data_parallel_rank
    finally:
        dist.destroy_process_group()


def test_the_topology_orders_the_parallelisms_over_the_ranks_the_last_on_neighbours():
    shape, groups, data_rank = _group_ranks(("dp", "fsdp", "pp", "tp"), 5, dp=None, fsdp=2, pp=2, tp=2)
    assert shape == (1, 2, 1, 2, 2) and data_rank == 1  # sp, left out, just after fsdp
    assert groups == {"dp": [5], "fsdp": [1, 5], "pp": [5, 7], "tp": [4, 5]}
    shape, groups, data_rank = _group_ranks(("tp", "pp", "dp", "fsdp"), 5, dp=None, fsdp=2, pp=2, tp=2)
    assert shape == (2, 2, 1, 2, 1) and data_rank == 1
    assert groups == {"tp": [1, 5], "pp": [5, 7], "dp": [5], "fsdp": [4, 5]}


def test_fsdp_shards_over_the_context_parallel_ranks_too():
    shape, groups, data_rank = _group_ranks(("dp", "fsdp", "pp", "sp", "tp"), 5, dp=None, fsdp=2, pp=2, sp=2, tp=1)
    assert shape == (1, 2, 2, 2, 1) and data_rank == 1
    assert groups == {"dp": [5], "fsdp": [1, 5], "pp": [5, 7], "sp": [4, 5], "tp": [5], "shard": [[0, 1, 4, 5]]}


@pytest.mark.parametrize(
    "topology, message",
    [
        (["dp", "fsdp", "tp"], r"must order each of \['dp', 'fsdp', 'pp', 'tp'\] once \(and \"sp\", or leave it out\)"),
        (["dp", "fsdp", "pp", "tp", "tp"], r"must order each of"),
        (["fsdp", "dp", "pp", "tp"], r"puts fsdp before dp, but FSDP2 shards within the replicas of dp"),
        (["dp", "sp", "fsdp", "pp", "tp"], r"puts sp before fsdp, but FSDP2 shards over fsdp and sp together"),
    ],
)
def test_a_topology_that_is_not_an_order_of_the_dims_says_what_to_give(topology, message):
    with pytest.raises(ValueError, match=message):
        ParallelDims(dp=None, fsdp=1, tp=1, world_size=1, topology=topology)
