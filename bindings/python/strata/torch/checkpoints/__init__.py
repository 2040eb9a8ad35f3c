"""strata.torch.checkpoints -- checkpoints in and out at the drive's speed: safetensors files
(one ``model.safetensors``, or shards with ``model.safetensors.index.json``: the Hugging
Face layout) loaded into a model's tensors and saved from them, offloaded parameters
included, without materializing the model or the file (docs/checkpoints.md).

- :func:`load_safetensors`: names matched as ``load_state_dict`` matches them (``strict``,
  missing / unexpected keys as torch reports them, tied weights), dtypes converted in
  flight, each tensor streamed from the file into its parameter's store object or memory;
- :func:`save_safetensors`: ``save_pretrained``'s files (``max_shard_size``), streamed
  from the store objects and memory, durable and renamed into place;
- :func:`load_torch_state_dict`: a ``torch.save`` state dict (zip archive) loaded the same
  way, its pickle read by a restricted unpickler, its storages in place;
  :func:`save_torch_state_dict`: one written for ``torch.load``, in place in pieces (from
  one process or from every ZeRO-3 rank, each its own slices).

The bytes move in C++ (strata/store/safetensors.hpp: O_DIRECT aligned superset reads and
writes through the IoEngine, pinned pieces in flight); this package maps a model's names
onto tensors and store objects, reaching offloaded parameters only through the offload
wing's public names (``is_offloaded``, ``offload_of``, ``ParameterOffload.value_object`` /
``overwrite_object``).

Modules: _files.py (the files: index, shard names, size strings), _entries.py (a model's
state_dict entries, tied tensors, dtypes, torch's key report), _load.py
(load_safetensors, load_torch_state_dict), _save.py (save_safetensors), _torch_zip.py
(torch.save archives: central directory, restricted unpickler), _torch_save.py
(save_torch_state_dict), _save_ranks.py (save_safetensors and save_torch_state_dict
from every ZeRO-3 rank, each writing its own slices in place), _ranks.py (the protocol of
files written by every rank at once, shared with the universal layout), _universal_zip.py
(torch.save zips laid out in advance: a state dict's, one tensor's).
"""

from ._load import load_safetensors, load_torch_state_dict
from ._save import save_safetensors
from ._torch_save import save_torch_state_dict

__all__ = ["load_safetensors", "save_safetensors", "load_torch_state_dict",
           "save_torch_state_dict"]
