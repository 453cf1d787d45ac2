"""xm's gathers, scatters, exchanges and point-to-point transfers on 2 real gloo processes.

The two ranks run every scenario once (module fixture ``ranks``), recording what they saw; the
tests below check those records against the math, computed here.
"""

import numpy as np
import pytest
import torch

import accrewrite.runtime.xla_model as xm

from _ranks import run_ranks

WORLD = 2


def _x(rank):
    return torch.arange(8.0).reshape(2, 4) + 100 * rank


def _y(rank):
    return torch.arange(24.0).reshape(4, 6) * (rank + 1)


def _errors(calls):
    out = {}
    for label, call in calls.items():
        try:
            call()
            out[label] = "returned"
        except ValueError as error:
            out[label] = str(error)
    return out


def _worker(rank):
    x, y = _x(rank), _y(rank)
    out = {
        "gather_0": xm.all_gather(x),
        "gather_1": xm.all_gather(x, dim=1),
        "gather_last_unpinned": xm.all_gather(x, dim=-1, pin_layout=False),
        "gather_list": xm.all_gather([x, x.t()], dim=1, pin_layout=False),
        "gather_alone": xm.all_gather(x, groups=[[0], [1]]),
        "gather_pair": xm.all_gather(x, dim=1, groups=[[0, 1]]),
        "gather_input_after": x,
    }
    output = torch.empty(4, 4)
    out["gather_output_is_returned"] = xm.all_gather(x, output=output) is output
    out["gather_output"] = output

    out["scatter_0"] = xm.reduce_scatter(xm.REDUCE_SUM, y, 0.5, 0, 2)
    out["scatter_1"] = xm.reduce_scatter(xm.REDUCE_SUM, y, 1.0, 1, 2)
    out["scatter_max"] = xm.reduce_scatter(xm.REDUCE_MAX, y, 2.0, 0, 2)
    out["scatter_int"] = xm.reduce_scatter(xm.REDUCE_SUM, y.long(), 1.0, 0, 2)
    out["scatter_list"] = xm.reduce_scatter(xm.REDUCE_SUM, [y, y + 1], 1.0, 1, 2, pin_layout=False)
    out["scatter_alone"] = xm.reduce_scatter(xm.REDUCE_SUM, y, 0.5, 0, 1, groups=[[0], [1]])
    output = torch.empty(2, 6)
    out["scatter_output_is_returned"] = xm.reduce_scatter(xm.REDUCE_SUM, y, 1.0, 0, 2, output=output) is output
    out["scatter_output"] = output
    out["scatter_input_after"] = y

    out["all_to_all_0_0"] = xm.all_to_all(y, 0, 0, 2)
    out["all_to_all_1_0"] = xm.all_to_all(y, 1, 0, 2)
    out["all_to_all_0_1"] = xm.all_to_all(y, 0, 1, 2, groups=[[0, 1]])

    out["permute_swap"] = xm.collective_permute(x, [[0, 1], [1, 0]])
    out["permute_one_way"] = xm.collective_permute(x, [[0, 1]])
    out["permute_stay"] = xm.collective_permute(x, [[0, 0], [1, 1]])

    ran = []
    xm.add_step_closure(lambda: ran.append(1))
    out["mesh_sum"] = xm.mesh_reduce("sum", rank + 0.5, sum)
    out["mesh_marked_the_step"] = ran == [1]
    out["mesh_every_rank"] = xm.mesh_reduce("all", {"rank": rank, "x": x}, lambda datas: datas)
    out["mesh_numpy"] = xm.mesh_reduce("numpy", np.float64(rank), np.mean)

    # channel 7 carries two values from rank 0 to rank 1, channel 3 one back
    if rank == 0:
        out["sent"] = [xm.send(x, 7), xm.send(x * 2, 7)]
        out["received"] = [xm.recv(torch.zeros(3, dtype=torch.int64), 3)]
    else:
        out["received"] = [xm.recv(torch.zeros(2, 4), 7), xm.recv(torch.zeros(2, 4), 7)]
        out["sent"] = [xm.send(torch.tensor([5, 6, 7]), 3)]

    out["errors"] = _errors({
        "shard_count": lambda: xm.reduce_scatter(xm.REDUCE_SUM, y, 1.0, 0, 4),
        "split_count": lambda: xm.all_to_all(y, 0, 0, 1),
        "permute_twice_to_one": lambda: xm.collective_permute(x, [[0, 1], [1, 1]]),
    })
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_worker, WORLD)


@pytest.mark.launches_ranks
def test_all_gather_concatenates_every_rank_along_dim(ranks):
    for rank, out in enumerate(ranks):
        both = [_x(0), _x(1)]
        assert torch.equal(out["gather_0"], torch.cat(both, 0))
        assert torch.equal(out["gather_1"], torch.cat(both, 1))
        assert torch.equal(out["gather_last_unpinned"], torch.cat(both, 1))
        assert torch.equal(out["gather_pair"], torch.cat(both, 1))
        assert out["gather_1"].is_contiguous()
        assert [t.tolist() for t in out["gather_list"]] == [
            torch.cat(both, 1).tolist(), torch.cat([t.t() for t in both], 1).tolist()
        ]
        assert out["gather_output_is_returned"] and torch.equal(out["gather_output"], torch.cat(both, 0))
        assert torch.equal(out["gather_alone"], _x(rank))
        assert torch.equal(out["gather_input_after"], _x(rank))


@pytest.mark.launches_ranks
def test_reduce_scatter_reduces_then_gives_each_rank_its_scaled_shard(ranks):
    total = _y(0) + _y(1)
    for rank, out in enumerate(ranks):
        assert torch.equal(out["scatter_0"], total.chunk(2, 0)[rank] * 0.5)
        assert torch.equal(out["scatter_1"], total.chunk(2, 1)[rank])
        assert torch.equal(out["scatter_max"], torch.maximum(_y(0), _y(1)).chunk(2, 0)[rank] * 2.0)
        assert out["scatter_int"].dtype == torch.int64
        assert torch.equal(out["scatter_int"], total.long().chunk(2, 0)[rank])
        assert [t.tolist() for t in out["scatter_list"]] == [
            total.chunk(2, 1)[rank].tolist(), (total + 2).chunk(2, 1)[rank].tolist()
        ]
        assert out["scatter_output_is_returned"] and torch.equal(out["scatter_output"], total.chunk(2, 0)[rank])
        assert torch.equal(out["scatter_alone"], _y(rank) * 0.5)  # a group of one: its own input
        assert torch.equal(out["scatter_input_after"], _y(rank))


@pytest.mark.launches_ranks
def test_all_to_all_exchanges_blocks(ranks):
    for rank, out in enumerate(ranks):
        # block ``rank`` of every rank's split, concatenated in rank order
        for key, split, concat in [("all_to_all_0_0", 0, 0), ("all_to_all_1_0", 1, 0), ("all_to_all_0_1", 0, 1)]:
            expected = torch.cat([_y(source).chunk(2, split)[rank] for source in range(WORLD)], concat)
            assert torch.equal(out[key], expected), key


@pytest.mark.launches_ranks
def test_collective_permute_follows_the_source_target_pairs(ranks):
    for rank, out in enumerate(ranks):
        assert torch.equal(out["permute_swap"], _x(1 - rank))
        assert torch.equal(out["permute_one_way"], _x(0) if rank == 1 else torch.zeros(2, 4))
        assert torch.equal(out["permute_stay"], _x(rank))


@pytest.mark.launches_ranks
def test_mesh_reduce_applies_the_function_to_every_ranks_data(ranks):
    for out in ranks:
        assert out["mesh_sum"] == 0.5 + 1.5 and out["mesh_marked_the_step"]
        assert [d["rank"] for d in out["mesh_every_rank"]] == [0, 1]
        assert all(torch.equal(d["x"], _x(d["rank"])) for d in out["mesh_every_rank"])
        assert out["mesh_numpy"] == 0.5  # numpy scalars travel too


@pytest.mark.launches_ranks
def test_send_and_recv_deliver_on_their_channel(ranks):
    first, second = ranks
    assert [t.tolist() for t in second["received"]] == [_x(0).tolist(), (_x(0) * 2).tolist()]
    assert [t.tolist() for t in first["sent"]] == [_x(0).tolist(), (_x(0) * 2).tolist()]
    assert first["received"][0].tolist() == [5, 6, 7] and first["received"][0].dtype == torch.int64


@pytest.mark.launches_ranks
def test_counts_that_do_not_match_the_group_are_refused(ranks):
    for out in ranks:
        errors = out["errors"]
        assert "shard_count=4 in a group of 2" in errors["shard_count"]
        assert "split_count=1 in a group of 2" in errors["split_count"]
        assert "receives at most once" in errors["permute_twice_to_one"]
