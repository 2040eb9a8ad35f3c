"""The entry points of parameter offload: :func:`offload_parameters` (a built model) and
:func:`offload_init` (a model constructed with its parameters already offloaded).

Thread-safety: offload_init patches ``torch.nn.Module.register_parameter`` for its block
(process-wide): no other thread may build modules meanwhile.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Union

import torch

import strata

from ._handle import ParameterOffload


def offload_parameters(model: torch.nn.Module, store: Optional[strata.Store] = None, *,
                       path: Optional[str] = None, working_set: Union[int, str] = "1GiB",
                       tier: str = "nvme", key_prefix: str = "params/", prefetch: bool = True,
                       resume: bool = False, overwrite: bool = False, comm: Any = None,
                       average_gradients: bool = True,
                       tile_bytes: Optional[Union[int, str]] = None,
                       grad_host_budget: Union[int, str] = 0,
                       release_memory: Optional[bool] = None) -> ParameterOffload:
    """Moves every parameter of ``model`` into a strata store; they are materialized in a
    working set of at most ``working_set`` bytes while forward and backward use them (see
    the module doc). ``model(x)``, ``loss.backward()`` and the optimizer calls stay as
    they were; pass the model's parameters to ``strata.torch.OffloadAdam``/``OffloadAdamW``
    (created after this call) to have gradients and optimizer state offloaded too.

    :param model: the module (CPU or CUDA parameters; floating point). Its parameter
        objects are kept (their class becomes :class:`OffloadedParameter`).
    :param store: the strata.Store to use (not closed by the offload). Default: a store
        at ``path`` (durability "flush", 4 MiB chunks), a temporary one when ``path`` is None
        too (removed by :meth:`ParameterOffload.close`).
    :param working_set: bytes (int or "2GiB") of parameter data in memory at once,
        prefetches included. A parameter larger than it is still fetched, alone.
    :param tier: "nvme" or "host": the store tier of the parameters and gradients.
    :param key_prefix: store keys are ``<key_prefix><parameter name>`` (gradients: ``#grad``
        appended). Default "params/".
    :param prefetch: fetch ahead along the order traced in the previous forward/backward of
        the same kind (default True; False: on demand only).
    :param resume: take the parameters' values from the store (as left by an earlier
        offload or a strata optimizer's resume) instead of the model's.
    :param overwrite: replace parameters already stored under ``key_prefix``.
    :param comm: a ``strata.distributed.Communicator`` of a data-parallel job (ZeRO-3): every
        rank calls this with the same model; each parameter becomes a partitioned object
        (rank r keeps its slice in its own ``store``), a parameter is assembled by
        ``fetch_partitioned`` (every rank reads its slice, then all-gather) and gradients are
        reduce-scattered to their owners, so each rank's optimizer steps its slices. Ranks
        must use the parameters in the same order (the same model code on the same shapes),
        as every fetch is a collective. Default None (one process; also a size-1 comm).
    :param average_gradients: with ``comm``: the reduced gradients are divided by the
        number of ranks (DDP's mean); False: summed.
    :param tile_bytes: bytes (int or "16MiB"): a parameter of more bytes (CPU, contiguous,
        one process) is *tiled*: ``F.linear``/``F.embedding`` over it (``nn.Linear``,
        ``nn.Embedding``, a tied output head) compute on blocks of whole rows of at most
        this size and of half ``working_set`` read in turn (the next in flight; two
        blocks counted in the working set), its gradient goes block by block into its
        gradient object, and strata's optimizer (in the offload's store) steps it from
        there: neither is ever whole in memory (docs/offload.md, "Tiling"). Only with
        ``tier="nvme"`` (the host tier holds parameters in memory anyway: nothing is
        tiled). Default None: nothing is tiled.
    :param grad_host_budget: bytes (int or "256MiB") of gradients a strata optimizer holds
        that stay in host memory between micro-batches and until the step instead of going
        to the store: each gradient about to be stored is held when its bytes (fp32 sums of
        fp16/bf16 parameters: 4 per element; under ZeRO-3 this rank's slice) fit in what is
        left, first come first held, never more than the budget in all; the others go to
        the store. A held gradient costs no store bytes: an fp32 parameter's gradient over
        ``k`` micro-batches moves 0 bytes per element instead of ``4k`` written and ``4k``
        read (``stats()``: ``grad_bytes_written``/``grad_bytes_read``; ``grad_host_bytes``
        is what is held). Tiled parameters' gradients are never held. Default 0: every
        gradient goes to the store, so memory stays bounded by ``working_set`` unless the
        caller grants more (docs/offload.md, "Gradients held in host memory").
    :param release_memory: how glibc's malloc treats freed memory, process-wide
        (offload/_memory.py, ReleaseRule; docs/offload.md, "Memory"). True: *released* --
        the mmap threshold fixed at 128 KiB, so freed parameter and gradient buffers go
        back to the system at once and the resident set stays near the working set, at the
        cost of a page fault per 4 KiB page of every allocation of 128 KiB or more in the
        process, torch's activations and gradients included. False: *kept* -- mmap
        threshold 32 MiB, trim threshold 1 GiB: the buffers an iteration allocates and
        frees are reused from the heap (on the main job's model 3.4k instead of 112k minor
        faults per iteration, 2.8 instead of 4.1 CPU-seconds), the heap holding up to that
        much free memory. None (default): kept (trim threshold at most an eighth of the
        memory available), released once 4 x the bytes of the parameters offloaded
        (parameters, gradients and two moments) exceed the memory available when the
        offload started (MemAvailable, or a memory cgroup's headroom where smaller), i.e.
        where the training state would not fit. Released stays released for the process.
    :returns: the :class:`ParameterOffload` handle (stats, grad, read, checkpoint, close).
    :raises TypeError: ``model`` is not a Module; a size argument (``working_set``,
        ``tile_bytes``, ``grad_host_budget``) neither an int nor a size string;
        ``release_memory`` not True, False or None.
    :raises ValueError: a non-floating-point or sparse parameter (named), a parameter
        offloaded already, ``working_set`` <= 0, ``grad_host_budget`` < 0, an unknown tier,
        resume with overwrite, resume without a store or path, a stored parameter of
        another size (resume).
    :raises strata.AlreadyExistsError: the store holds a parameter under the prefix (neither
        resume nor overwrite).
    :raises strata.NotFoundError: resume and a parameter missing from the store.
    """
    if resume is True and overwrite is True:  # (before a store is opened for resume)
        raise ValueError("offload_parameters: resume=True keeps the stored parameters that "
                         "overwrite=True replaces: pass one of them")
    handle = ParameterOffload(store, path, working_set, tier, key_prefix, prefetch, resume,
                              comm, average_gradients, tile_bytes, grad_host_budget,
                              release_memory)
    try:
        return handle.attach(model, resume=resume, overwrite=overwrite)
    except BaseException:
        handle.close(restore=False)
        raise


@contextlib.contextmanager
def offload_init(store: Optional[strata.Store] = None, *, path: Optional[str] = None,
                 working_set: Union[int, str] = "1GiB", tier: str = "nvme",
                 key_prefix: str = "params/", prefetch: bool = True,
                 resume: bool = False, comm: Any = None, average_gradients: bool = True,
                 tile_bytes: Optional[Union[int, str]] = None,
                 grad_host_budget: Union[int, str] = 0,
                 release_memory: Optional[bool] = None) -> Iterator[ParameterOffload]:
    """Constructs a model whose parameters never all exist in memory (the counterpart of
    DeepSpeed's ``zero.Init``): every parameter a module registers inside the ``with``
    block is stored and released at once, so construction takes the largest parameter's
    memory, not the model's; initialization in place afterwards (``nn.init.normal_(p)``,
    ``reset_parameters``) materializes each parameter in the working set and stores the
    result (a tiled parameter, ``tile_bytes``, is initialized block by block instead). A
    module built with ``device="meta"`` inside the block (``nn.Embedding(n, d,
    device="meta")``) gets CPU parameters whose values are zeros made in the store, so
    not even the largest parameter is ever allocated: with tiling, a table larger than
    memory is built and initialized within the working set. Then attach the model to the
    handle, which names its parameters::

        with strata.torch.offload_init(store, working_set="64MiB") as h:
            model = GPT(...)
        h.attach(model)                     # as offload_parameters(model, store, ...)

    Arguments as :func:`offload_parameters`. Parameters registered in the block but not in
    the attached model get their values back in memory at attach(). Thread-safety: patches
    ``torch.nn.Module.register_parameter`` for the block's duration (process-wide): no
    other thread may build modules meanwhile.

    :raises ValueError: as offload_parameters; a nested offload_init.
    """
    global _INIT_ACTIVE
    if _INIT_ACTIVE:
        raise ValueError("offload_init: already inside an offload_init block")
    handle = ParameterOffload(store, path, working_set, tier, key_prefix, prefetch, resume,
                              comm, average_gradients, tile_bytes, grad_host_budget,
                              release_memory)
    original = torch.nn.Module.register_parameter

    def register_parameter(module: torch.nn.Module, name: str, param: Any) -> None:
        meta = param is not None and param.is_meta
        if meta:  # built on the meta device: a CPU parameter of zeros, in the store only
            param = torch.nn.Parameter(
                torch.zeros((), dtype=param.dtype).expand(param.shape),
                requires_grad=param.requires_grad)
        original(module, name, param)
        if param is not None:
            handle.init_offload(param, zeros=meta)

    torch.nn.Module.register_parameter = register_parameter  # type: ignore[assignment]
    _INIT_ACTIVE = True
    try:
        yield handle
    except BaseException:
        torch.nn.Module.register_parameter = original  # type: ignore[assignment]
        _INIT_ACTIVE = False
        handle.close()
        raise
    torch.nn.Module.register_parameter = original  # type: ignore[assignment]
    _INIT_ACTIVE = False


_INIT_ACTIVE = False
