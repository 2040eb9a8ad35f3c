"""strata.torch.save_safetensors: what it writes reads back through an independent reader of
the format (spec_files.py; and the `safetensors` package where importable) with the model's
values, laid out as save_pretrained lays them out (shards cut at max_shard_size, the index,
the reference writer's order, tied weights once); export -> import round trips are
bit-identical, offloaded or not; an edit in memory and a dtype conversion are exported as
torch would hold them."""
import json
import os
import sys

import pytest
import torch

import strata.torch as st

sys.path.insert(0, os.path.dirname(__file__))
import spec_files  # noqa: E402
from test_safetensors_load import Net  # noqa: E402


def trained_net(seed=0):
    torch.manual_seed(seed)
    m = Net()
    with torch.no_grad():
        m.low.normal_()
        m.hlf.normal_()
        m.bn.running_mean.normal_()
        m.bn.num_batches_tracked.fill_(9)
    return m


def unique_state(m):
    """state_dict without the tied head (saved once, under the embedding's name)."""
    return {k: v for k, v in m.state_dict().items() if k != "head.weight"}


def test_single_file_reads_back_independently(tmp_path):
    m = trained_net()
    paths = st.save_safetensors(m, str(tmp_path), metadata={"format": "pt", "who": "test"})
    assert paths == [str(tmp_path / "model.safetensors")]
    meta, tensors, data_start = spec_files.read(paths[0])
    assert meta == {"format": "pt", "who": "test"}
    assert data_start % 4096 == 0
    want = unique_state(m)
    assert sorted(tensors) == sorted(want)
    for k, v in want.items():
        assert tensors[k].dtype == v.dtype and torch.equal(tensors[k], v), k
    # the reference writer's order: 8-byte dtypes first, then 4, 2 bytes; by name within
    with open(paths[0], "rb") as f:
        f.seek(8)
        header = json.loads(f.read(data_start - 8))
    header.pop("__metadata__")
    order = [k for k, _ in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])]
    assert order == ["bn.num_batches_tracked", "bn.bias", "bn.running_mean", "bn.running_var",
                     "bn.weight", "emb.weight", "fc.bias", "fc.weight", "low", "hlf"]


def test_shards_are_cut_as_save_pretrained_cuts_them(tmp_path):
    m = trained_net(1)
    (tmp_path / "model.safetensors").write_bytes(b"stale")  # an earlier save's file
    # sizes in state_dict order: low 42, hlf 10, emb 4800, fc.weight 3840, fc.bias 160,
    # bn 4 x 160 + 8: a 4000-byte limit puts emb alone, then cuts before fc.weight...
    paths = st.save_safetensors(m, str(tmp_path), max_shard_size=4000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    sizes = {k: v.numel() * v.element_size() for k, v in unique_state(m).items()}
    assert index["metadata"] == {"total_size": sum(sizes.values())}
    # huggingface_hub's algorithm, independently
    shards, cur, size = [], [], 0
    for k, n in sizes.items():
        if n > 4000:
            shards.append([k])
            continue
        if size + n > 4000:
            shards.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += n
    shards.append(cur)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    assert paths == [str(tmp_path / n) for n in names] + [str(tmp_path / "model.safetensors.index.json")]
    assert index["weight_map"] == {k: names[i] for i, ks in enumerate(shards) for k in ks}
    assert not (tmp_path / "model.safetensors").exists()
    for i, n in enumerate(names):
        _, tensors, _ = spec_files.read(str(tmp_path / n))
        assert sorted(tensors) == sorted(shards[i])
    back = Net()
    assert tuple(st.load_safetensors(back, str(tmp_path))) == ([], [])
    for k, v in m.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    # saving again unsharded removes the shards and the index
    st.save_safetensors(m, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]
    with pytest.raises(ValueError, match="max_shard_size: cannot read 'big'"):
        st.save_safetensors(m, str(tmp_path), max_shard_size="big")


@pytest.mark.parametrize("tier", ["nvme", "host"])
def test_offloaded_round_trip_is_bit_identical(tmp_path, store, tier):
    m = trained_net(2)
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    with st.offload_parameters(m, store, working_set="32KiB", tier=tier) as h:
        with torch.no_grad():  # an edit in memory, not yet stored: exported as it is
            m.fc.bias.add_(1.0)
        ref["fc.bias"] = ref["fc.bias"] + 1.0
        st.save_safetensors(h, str(tmp_path / "a"), max_shard_size="6KB")
    other = Net()
    with st.offload_parameters(other, store, working_set="32KiB", key_prefix="other/") as h2:
        assert tuple(st.load_safetensors(other, str(tmp_path / "a"))) == ([], [])
        st.save_safetensors(h2, str(tmp_path / "b"), max_shard_size="6KB")
        for k, v in ref.items():
            assert torch.equal(other.state_dict()[k], v), k
    assert sorted(os.listdir(tmp_path / "a")) == sorted(os.listdir(tmp_path / "b"))
    for f in os.listdir(tmp_path / "a"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_dtype_conversion_on_export(tmp_path):
    m = trained_net(3)
    st.save_safetensors(m, str(tmp_path), dtype=torch.bfloat16)
    _, tensors, _ = spec_files.read(str(tmp_path / "model.safetensors"))
    for k, v in unique_state(m).items():
        want = v.to(torch.bfloat16) if v.is_floating_point() else v
        assert tensors[k].dtype == want.dtype and torch.equal(tensors[k], want), k
    with pytest.raises(TypeError, match="dtype: expected a floating dtype"):
        st.save_safetensors(m, str(tmp_path), dtype=torch.int8)


def test_the_safetensors_package_reads_the_export(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    m = trained_net(4)
    st.save_safetensors(m, str(tmp_path))
    got = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    for k, v in unique_state(m).items():
        assert torch.equal(got[k], v), k


def test_parameters_linked_to_an_optimizer_export_their_masters(tmp_path, store):
    torch.manual_seed(5)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    h = st.offload_parameters(m, store, working_set="16KiB")
    opt = st.OffloadAdamW(m.parameters(), lr=1e-2, store=store, overlap_backward=True)
    for _ in range(2):
        opt.zero_grad()
        m(torch.randn(4, 64)).sum().backward()
        opt.step()
    assert all(h.linked(p) for p in m.parameters())
    st.save_safetensors(m, str(tmp_path))
    _, tensors, _ = spec_files.read(str(tmp_path / "model.safetensors"))
    for k, v in m.state_dict().items():
        assert torch.equal(tensors[k], v), k
    with pytest.raises(ValueError, match="linked to a strata optimizer's master"):
        st.load_safetensors(m, str(tmp_path))
    opt.close()
    h.close()


def test_non_contiguous_tensors_are_saved_row_major(tmp_path):
    m = trained_net(6)
    m.fc.weight.data = m.fc.weight.data.t().contiguous().t()  # same values, transposed layout
    assert not m.fc.weight.is_contiguous()
    st.save_safetensors(m, str(tmp_path))
    _, tensors, _ = spec_files.read(str(tmp_path / "model.safetensors"))
    assert torch.equal(tensors["fc.weight"], m.fc.weight)
