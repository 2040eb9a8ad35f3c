"""strata.torch.load_safetensors: files written here by an independent writer of the format
(spec_files.py) load with exactly the values they hold, into plain and offloaded models
(dtype conversion in flight, tied weights, buffers); keys, strict errors and size
mismatches as torch's load_state_dict reports them for the same state dict; shards with
their index; each malformed file's error naming the file and the byte offset."""
import copy
import json
import os
import sys

import pytest
import torch

import strata
import strata.torch as st

sys.path.insert(0, os.path.dirname(__file__))
import spec_files  # noqa: E402


class Net(torch.nn.Module):
    """Tied embedding / head, a Linear with bias, BatchNorm buffers (fp32 and int64), a
    bf16 and an fp16 parameter."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 24)
        self.fc = torch.nn.Linear(24, 40)
        self.bn = torch.nn.BatchNorm1d(40)
        self.head = torch.nn.Linear(24, 50, bias=False)
        self.head.weight = self.emb.weight
        self.low = torch.nn.Parameter(torch.zeros(7, 3, dtype=torch.bfloat16))
        self.hlf = torch.nn.Parameter(torch.zeros(5, dtype=torch.float16))


def values(seed=1):
    """A state dict of Net's keys (the tied head under the embedding's name only) with
    values of the file dtypes given: fc.weight stored as bf16 (loaded into fp32), low as
    fp32 (loaded into bf16), the rest in their own dtypes."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {"emb.weight": r(50, 24), "fc.weight": r(40, 24).bfloat16(), "fc.bias": r(40),
            "bn.weight": r(40), "bn.bias": r(40), "bn.running_mean": r(40),
            "bn.running_var": r(40).abs(), "bn.num_batches_tracked": torch.tensor(17),
            "low": r(7, 3), "hlf": r(5).half()}


def expected(vals, model):
    """What load_state_dict leaves: each value converted to the model's dtype."""
    sd = model.state_dict()
    return {k: vals.get(k, vals.get("emb.weight") if k == "head.weight" else None).to(sd[k].dtype)
            for k in sd}


def check_model(model, want):
    sd = model.state_dict()
    assert list(sd) == list(want)
    for k, v in want.items():
        assert sd[k].dtype == v.dtype and torch.equal(sd[k], v), k


def test_independent_file_loads_its_values_into_a_plain_model(tmp_path):
    vals = values()
    spec_files.write(tmp_path / "m.safetensors", vals, {"format": "pt"})
    model = Net()
    ptr = model.fc.weight.data_ptr()
    v0 = model.fc.weight._version
    res = st.load_safetensors(model, str(tmp_path / "m.safetensors"))
    assert res.missing_keys == [] and res.unexpected_keys == []
    check_model(model, expected(vals, Net()))
    assert model.fc.weight.data_ptr() == ptr  # loaded into the existing tensors
    assert model.fc.weight._version > v0
    assert model.head.weight is model.emb.weight


def test_independent_file_loads_into_offloaded_parameters(tmp_path, store):
    vals = values(2)
    spec_files.write(tmp_path / "m.safetensors", vals)
    model = Net()
    with st.offload_parameters(model, store, working_set="64KiB") as h:
        v = h.version(model.fc.weight)
        res = st.load_safetensors(h, str(tmp_path / "m.safetensors"))
        assert tuple(res) == ([], [])
        assert h.version(model.fc.weight) == v + 1
        # the stored objects hold the values (read back by the store, not the model)
        assert torch.equal(store.get_tensor("params/fc.weight").view(40, 24),
                           vals["fc.weight"].float())
        check_model(model, expected(vals, Net()))
        out = model.fc(model.emb(torch.tensor([3])))
        ref = torch.nn.functional.linear(vals["emb.weight"][3:4], vals["fc.weight"].float(),
                                         vals["fc.bias"])
        assert torch.equal(out, ref)
    check_model(model, expected(vals, Net()))  # close() restored the loaded values


def test_keys_and_errors_are_torchs(tmp_path):
    vals = values(3)
    del vals["bn.running_var"], vals["hlf"]
    vals["extra.w"] = torch.ones(2)
    vals["fc.bias"] = torch.ones(41)
    spec_files.write(tmp_path / "m.safetensors", vals)
    sd = {k: v for k, v in vals.items()}
    ref = Net()
    with pytest.raises(RuntimeError) as torch_err:
        ref.load_state_dict(sd)
    with pytest.raises(RuntimeError) as ours:
        st.load_safetensors(Net(), str(tmp_path / "m.safetensors"))
    # torch lists the missing keys, the unexpected ones, then the size mismatch; the tied
    # head is missing for torch (safetensors' load_model drops it: one name loads it)
    assert str(ours.value) == str(torch_err.value).replace(', "head.weight"', "")
    assert 'size mismatch for fc.bias: copying a param with shape torch.Size([41]) from ' \
           'checkpoint, the shape in current model is torch.Size([40]).' in str(ours.value)
    del vals["fc.bias"]
    spec_files.write(tmp_path / "m.safetensors", vals)
    sd = dict(vals)
    want = Net().load_state_dict(sd, strict=False)
    model = Net()
    got = st.load_safetensors(model, str(tmp_path / "m.safetensors"), strict=False)
    assert got.unexpected_keys == want.unexpected_keys == ["extra.w"]
    assert got.missing_keys == [k for k in want.missing_keys if k != "head.weight"]
    assert type(got) is type(want)
    assert torch.equal(model.bn.running_mean, vals["bn.running_mean"])


def test_prefix_and_tied_names_and_scalars(tmp_path):
    vals = values(4)
    # a wrapper's checkpoint: every name under "model.", the tied head under its own name,
    # plus a tensor outside the prefix (ignored) and a 1-element tensor for the 0-d buffer
    file = {"model." + k: v for k, v in vals.items()}
    file["model.head.weight"] = file.pop("model.emb.weight") * 2
    file["model.bn.num_batches_tracked"] = torch.tensor([5])
    file["lm_extra"] = torch.zeros(3)
    spec_files.write(tmp_path / "m.safetensors", file)
    model = Net()
    res = st.load_safetensors(model, str(tmp_path / "m.safetensors"), prefix="model.")
    assert tuple(res) == ([], [])
    assert torch.equal(model.emb.weight, vals["emb.weight"] * 2)
    assert model.bn.num_batches_tracked.item() == 5


def test_sharded_index(tmp_path):
    vals = values(5)
    names = list(vals)
    shards = {"model-00001-of-00002.safetensors": names[:4],
              "model-00002-of-00002.safetensors": names[4:]}
    wm = {}
    for f, ks in shards.items():
        spec_files.write(tmp_path / f, {k: vals[k] for k in ks})
        wm.update({k: f for k in ks})
    index = {"metadata": {"total_size": 1}, "weight_map": wm}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    for path in (tmp_path, tmp_path / "model.safetensors.index.json"):
        model = Net()
        st.load_safetensors(model, str(path))
        check_model(model, expected(vals, Net()))
    # a shard the index names is missing; an index entry its shard lacks
    os.rename(tmp_path / "model-00002-of-00002.safetensors", tmp_path / "gone")
    with pytest.raises(FileNotFoundError, match=r"shard 'model-00002-of-00002.safetensors' "
                       r"\(of tensor 'bn.bias'\) is missing"):
        st.load_safetensors(Net(), str(tmp_path))
    os.rename(tmp_path / "gone", tmp_path / "model-00002-of-00002.safetensors")
    wm["nope"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="maps tensor 'nope' to shard "
                       "'model-00001-of-00002.safetensors', whose header lacks it"):
        st.load_safetensors(Net(), str(tmp_path))


def test_conversion_refused_names_the_key(tmp_path):
    vals = values(6)
    vals["bn.num_batches_tracked"] = torch.tensor(3.0)
    spec_files.write(tmp_path / "m.safetensors", vals)
    with pytest.raises(TypeError, match="bn.num_batches_tracked: the checkpoint's F32 tensor "
                       "cannot be loaded into a torch.int64 tensor"):
        st.load_safetensors(Net(), str(tmp_path / "m.safetensors"))


def test_non_contiguous_destination_and_copy(tmp_path):
    vals = values(7)
    spec_files.write(tmp_path / "m.safetensors", vals)
    model = Net()
    model.fc.weight.data = torch.zeros(24, 40).t()  # a transposed (non-contiguous) weight
    st.load_safetensors(model, str(tmp_path / "m.safetensors"))
    assert torch.equal(model.fc.weight, vals["fc.weight"].float())
    assert model.fc.weight.stride() == (1, 40)
    twin = copy.deepcopy(model)
    check_model(twin, expected(vals, Net()))


BAD = [  # (file bytes, message after "safetensors file '<path>': ")
    (b"\x10\x00\x00", "the file ends at byte 3, inside the 8-byte header length (bytes [0, 8))"),
    (spec_files.image('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')[:40],
     "header bytes [8, 62) run past the end of the file at byte 40"),
    (spec_files.image('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}}', bytes(8)),
     "tensor 'a': data_offsets [0,16] (file bytes [63, 79)) run past the end of the file at "
     "byte 71"),
    (spec_files.image('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                      '"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(8)),
     "tensor 'b' (file bytes [119, 123)) overlaps tensor 'a' (file bytes [115, 123))"),
    (spec_files.image('{"a":{"dtype":"Q8","shape":[2],"data_offsets":[0,8]}}', bytes(8)),
     "tensor 'a': unknown dtype 'Q8'"),
    (spec_files.image('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', bytes(8)),
     "tensor 'a': shape [3] of F32 is 12 bytes, but data_offsets [0,8] (file bytes [62, 70)) "
     "hold 8"),
    (spec_files.image('["a"]'), "the header at byte 8 does not start with '{': not a JSON "
     "object"),
    (spec_files.image('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}', bytes(8)),
     "the header's JSON is invalid at byte"),
]


@pytest.mark.parametrize("data,message", BAD)
def test_malformed_files_name_the_file_and_offset(tmp_path, data, message):
    path = str(tmp_path / "bad.safetensors")
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(strata.DataLossError) as e:
        st.load_safetensors(Net(), path)
    assert f"safetensors file '{path}': {message}" in str(e.value)


def test_no_checkpoint_and_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model.safetensors.index.json or "
                       "model.safetensors in the directory"):
        st.load_safetensors(Net(), str(tmp_path))
    with pytest.raises(TypeError, match="expected a torch.nn.Module or a ParameterOffload"):
        st.load_safetensors(object(), str(tmp_path))
    with pytest.raises(TypeError, match="strict: expected a bool"):
        st.load_safetensors(Net(), str(tmp_path), strict=1)


def test_batchnorm_counter_absent_is_filled_as_torch_fills_it(tmp_path):
    vals = values(8)
    del vals["bn.num_batches_tracked"]
    spec_files.write(tmp_path / "m.safetensors", vals)
    model = Net()
    with torch.no_grad():
        model.bn.num_batches_tracked.fill_(4)
    twin = copy.deepcopy(model)
    want = twin.load_state_dict(dict(vals), strict=False)  # a plain dict: no module versions
    got = st.load_safetensors(model, str(tmp_path / "m.safetensors"))  # strict: nothing missing
    assert got.missing_keys == [k for k in want.missing_keys if k != "head.weight"] == []
    assert model.bn.num_batches_tracked.item() == twin.bn.num_batches_tracked.item()
