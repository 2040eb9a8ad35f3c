"""strata.distributed — strata's collectives and partitioned objects from Python.

A :class:`Communicator` is a group of ranks (processes) running collectives over Gloo (host
memory, TCP) or NCCL (device memory, where built). Create one in every process of a job
started by ``strata launch`` or torchrun::

    import torch, strata, strata.distributed as sd
    with sd.Communicator() as comm:                       # RANK, WORLD_SIZE, MASTER_* env
        x = torch.full((4,), float(comm.rank))
        comm.all_reduce(x)                                # in place: sum over ranks
        store = strata.Store.open(f"/var/tmp/job/rank{comm.rank}")
        comm.put_partitioned(store, "w", torch.arange(10.0))   # each rank keeps its slice
        w = torch.empty(10)
        comm.fetch_partitioned(store, "w", w)             # every rank reads its slice, all-gather

**Rendezvous port.** ``Communicator()`` runs its own rendezvous server (on rank 0) on
``port`` if given, else ``$STRATA_MASTER_PORT``, else ``MASTER_PORT + PORT_OFFSET``
(:data:`PORT_OFFSET` = 1): never MASTER_PORT itself, which torchrun's agent (and
``torch.distributed``'s TCPStore) holds. :meth:`Communicator.from_torch` instead uses an
initialized ``torch.distributed`` process group's store to agree on a free port, so it
needs no port of its own.

**Arrays.** Every buffer is a ``torch.Tensor`` or ``numpy.ndarray`` (anything else:
TypeError naming the argument), C-contiguous (else ValueError), in the communicator's memory
(CPU for Gloo). ``dtype="bf16"`` lets a numpy uint16 array carry bfloat16 bits; torch bf16
tensors need nothing. Arrays are used in place, without copies.

**Ordering.** Every rank must issue the same operations in the same order with matching
sizes and dtypes, as with torch.distributed. The operations of one Communicator run one at a
time in issue order (including the collectives the partitioned calls issue internally), so
any number of ``*_async`` futures may be in flight; a buffer passed to an operation must not
be touched until its future is done.

**Errors** are ``strata.Error`` subclasses (docs/errors.md): a peer that died gives
:class:`strata.UnavailableError` naming its rank, a peer that hangs
:class:`strata.DeadlineExceededError` after ``timeout`` (default 30 s,
``$STRATA_COLL_TIMEOUT_MS``); the communicator is then broken (later calls raise
FailedPreconditionError): create a new one.

**Thread-safety.** A Communicator may be used from several Python threads; operations are
ordered by the order in which the calls were made. Blocking calls release the GIL.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _strata
from ._errors import DeadlineExceededError, FailedPreconditionError, InvalidArgumentError

__all__ = ["Communicator", "PartitionInfo", "partition_layout", "stat_partitioned",
           "remove_partitioned", "nccl_available", "PORT_OFFSET"]

#: ``Communicator()`` listens on MASTER_PORT + PORT_OFFSET unless a port is given.
PORT_OFFSET = 1

_torch_rendezvous_seq: Dict[int, int] = {}


def nccl_available() -> bool:
    """True when this build has the NCCL backend and a GPU is usable now."""
    return _strata._nccl_available()


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _arr(x: Any, name: str) -> Any:
    if isinstance(x, np.ndarray) or (_is_torch(x) and hasattr(x, "__dlpack__")):
        return x
    raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def _empty(like: Any, shape: Tuple[int, ...]) -> Any:
    if _is_torch(like):
        import torch
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    return np.empty(shape, dtype=like.dtype)


def _store_impl(store: Any) -> Any:
    impl = getattr(store, "_s", store)
    if not isinstance(impl, _strata._Store):
        raise TypeError(f"store must be a strata.Store, got {type(store).__name__}")
    return impl


def _default_timeout() -> float:
    try:
        return int(os.environ.get("STRATA_COLL_TIMEOUT_MS", "30000")) / 1000.0
    except ValueError:
        return 30.0  # the communicator's own parsing names the malformed variable


def _resolve_port(env: Dict[str, Any], port: Optional[int]) -> int:
    if port is not None:
        if isinstance(port, bool) or not isinstance(port, int):
            raise TypeError(f"port must be an int, got {type(port).__name__}")
        what, value = "port", port
    elif os.environ.get("STRATA_MASTER_PORT"):
        text = os.environ["STRATA_MASTER_PORT"]
        if not text.isdigit():
            raise InvalidArgumentError(
                f"environment variable STRATA_MASTER_PORT='{text}' is not a TCP port")
        what, value = "STRATA_MASTER_PORT", int(text)
    else:
        what, value = f"MASTER_PORT + {PORT_OFFSET}", env["master_port"] + PORT_OFFSET
    if not 1 <= value <= 65535:
        raise InvalidArgumentError(f"{what} = {value} is not a TCP port (1..65535); set "
                                   "STRATA_MASTER_PORT or pass port=")
    return value


@dataclasses.dataclass(frozen=True)
class PartitionInfo:
    """What one rank's store records about its part of a partitioned object."""

    key: str
    dtype: str              #: dtype of the full tensor ("fp32", "bf16", ...)
    shape: Tuple[int, ...]  #: shape of the full tensor
    numel: int              #: elements of the full tensor
    world_size: int         #: number of ranks it was put over
    rank: int               #: the rank whose slice this store holds
    owned_begin: int        #: first element of that slice
    owned_numel: int        #: elements in that slice (0 when numel < world_size, rank >= numel)


def partition_layout(numel: int, world_size: int) -> List[Tuple[int, int]]:
    """The elements each of ``world_size`` ranks owns of an object of ``numel`` elements:
    a list of ``(begin, end)`` per rank (end exclusive). With c = ceil(numel / world_size),
    rank r owns [min(r*c, numel), min((r+1)*c, numel)), possibly empty. Pure arithmetic.

    :raises InvalidArgumentError: (ValueError) numel < 0 or world_size < 1.
    """
    return [tuple(p) for p in _strata._partition_layout(numel, world_size)]


def stat_partitioned(store: Any, key: str) -> PartitionInfo:
    """This rank's record of partitioned object ``key`` in ``store`` (no collective).

    :raises NotFoundError: (KeyError) this store holds no part of ``key``.
    :raises DataLossError: the record is malformed.
    """
    return PartitionInfo(**_strata._stat_partitioned(_store_impl(store), key))


def remove_partitioned(store: Any, key: str) -> None:
    """Removes this rank's part of ``key`` (slice and record) from ``store``; no collective:
    every rank removes its own part.

    :raises NotFoundError: (KeyError) neither exists.
    """
    _strata._remove_partitioned(_store_impl(store), key)


class Communicator:
    """A group of ranks running collectives together (see the module docstring).

    ``Communicator(backend="gloo", *, port=None, timeout=None)`` is collective: every rank
    of the job calls it. It reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK
    (optional), as ``strata launch`` and torchrun set them; rank 0 serves the rendezvous on
    ``port`` / ``$STRATA_MASTER_PORT`` / ``MASTER_PORT + PORT_OFFSET`` (first set wins).

    :param backend: ``"gloo"`` (host memory) or ``"nccl"`` (GPU memory of
        ``LOCAL_RANK % devices``; NotImplementedError in a build without CUDA).
    :param timeout: seconds for the rendezvous and for each operation (default
        ``$STRATA_COLL_TIMEOUT_MS`` / 1000, else 30).
    :raises InvalidArgumentError: (ValueError) a variable missing or malformed, named.
    :raises UnavailableError: the port is in use (rank 0) or unreachable.
    :raises DeadlineExceededError: (TimeoutError) not every rank arrived within ``timeout``.
    :raises UnimplementedError: (NotImplementedError) nccl in a build without CUDA.

    Closing (``close()``, the end of a ``with`` block, garbage collection) runs the
    operations still queued, then disconnects.
    """

    def __init__(self, backend: str = "gloo", *, port: Optional[int] = None,
                 timeout: Optional[float] = None):
        env = _strata._read_distributed_env()
        self._c = _strata._Communicator.create(
            env["master_addr"], _resolve_port(env, port), env["rank"], env["world_size"],
            env["local_rank"], backend, timeout)

    @classmethod
    def from_torch(cls, process_group: Any = None, backend: str = "gloo", *,
                   timeout: Optional[float] = None) -> "Communicator":
        """A communicator over the ranks of an initialized ``torch.distributed`` process
        group (default: the world group), with the same rank numbers.

        torch's process groups cannot be driven from strata's C++ without libtorch, so this
        uses the group's store (torch's TCPStore) only to agree on the rendezvous: group
        rank 0 starts strata's rendezvous server on a free port and publishes
        ``"addr:port"`` under ``strata/rendezvous/<n>`` (addr = $MASTER_ADDR, else this
        host's name); then strata's own Gloo connections are set up. Collective over the
        group: its ranks call it in the same order. ``torch.distributed`` keeps working
        beside it.

        :raises FailedPreconditionError: torch.distributed is not initialized, or the group
            has no store (MPI).
        :raises ValueError: this process is not a member of ``process_group``.
        :raises DeadlineExceededError: (TimeoutError) group rank 0 did not publish within
            ``timeout``; otherwise as ``Communicator()``.
        """
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            raise FailedPreconditionError(
                "torch.distributed is not initialized: call torch.distributed."
                "init_process_group() first, or use Communicator() for strata's own rendezvous")
        from torch.distributed import distributed_c10d as c10d
        pg = process_group if process_group is not None else c10d._get_default_group()
        rank, size = dist.get_rank(pg), dist.get_world_size(pg)
        if rank < 0:
            raise ValueError("this process is not a member of process_group")
        store = c10d._pg_map.get(pg, (None, None))[1]
        if store is None:
            raise FailedPreconditionError("the torch process group has no store (MPI backend?)")
        seq = _torch_rendezvous_seq.get(id(pg), 0)
        _torch_rendezvous_seq[id(pg)] = seq + 1
        key = f"strata/rendezvous/{seq}"
        wait_s = timeout if timeout is not None else _default_timeout()
        host = None
        if rank == 0:
            host = _strata._RendezvousHost.start(0)
            addr = os.environ.get("MASTER_ADDR") or socket.gethostname()
            store.set(key, f"{addr}:{host.port}")
        else:
            try:
                store.wait([key], datetime.timedelta(seconds=wait_s))
            except RuntimeError as e:
                raise DeadlineExceededError(
                    f"rank {rank}: group rank 0 did not publish strata's rendezvous address "
                    f"under '{key}' in torch's store within {wait_s} s: {e}") from None
            addr, _, port_text = store.get(key).decode().rpartition(":")
        port = host.port if host is not None else int(port_text)
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        self = cls.__new__(cls)
        self._c = _strata._Communicator.create(addr, port, rank, size, local_rank, backend,
                                               timeout, host)
        del host  # the communicator keeps the server until close()
        if rank == 0:
            try:
                store.delete_key(key)  # every rank has read it: the communicator is up
            except (RuntimeError, AttributeError):
                pass
        return self

    # ---- lifetime / properties -----------------------------------------------------------
    def close(self) -> None:
        """Runs the queued operations, then disconnects (rank 0 waits, at most
        min(timeout, 10 s), for the others to disconnect from its rendezvous server).
        Idempotent; later calls raise FailedPreconditionError."""
        self._c.close()

    @property
    def closed(self) -> bool:
        return self._c.closed

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def rank(self) -> int:
        """This process's rank, 0 <= rank < size."""
        return self._c.rank

    @property
    def size(self) -> int:
        """Number of ranks (world size)."""
        return self._c.size

    @property
    def backend(self) -> str:
        """``"gloo"`` or ``"nccl"``."""
        return self._c.backend

    @property
    def timeout(self) -> float:
        """Seconds after which a silent peer makes an operation fail (DeadlineExceeded)."""
        return self._c.timeout

    def owned_range(self, numel: int) -> Tuple[int, int]:
        """``partition_layout(numel, size)[rank]``: the elements [begin, end) this rank owns
        of a partitioned object of ``numel`` elements."""
        return partition_layout(numel, self.size)[self.rank]

    # ---- collectives ---------------------------------------------------------------------
    def all_gather_async(self, send: Any, out: Any = None, *, dtype: Optional[str] = None):
        """As :meth:`all_gather`; returns a strata.Future whose result is ``out``."""
        send = _arr(send, "send")
        if out is None:
            shape = tuple(send.shape)
            shape = (self.size * shape[0],) + shape[1:] if shape else (self.size,)
            out = _empty(send, shape)
        return self._c.all_gather_async(send, _arr(out, "out"), dtype)

    def all_gather(self, send: Any, out: Any = None, *, dtype: Optional[str] = None) -> Any:
        """Rank r's ``send`` (n elements) lands in ``out`` at elements [r*n, (r+1)*n) on
        every rank; returns ``out``. ``out``: size*n elements of send's dtype, any shape;
        None allocates one like ``send`` concatenated along dim 0 (shape (size*d0, ...),
        (size,) for a 0-d send). ``send`` may be out's own block (in place).

        :raises ValueError: sizes or dtypes that do not match (naming the argument)."""
        return self.all_gather_async(send, out, dtype=dtype).result()

    def reduce_scatter_async(self, send: Any, out: Any = None, op: str = "sum", *,
                             dtype: Optional[str] = None):
        """As :meth:`reduce_scatter`; returns a strata.Future whose result is ``out``."""
        send = _arr(send, "send")
        if out is None:
            shape, n = tuple(send.shape), self.size
            if shape and shape[0] % n == 0:
                out = _empty(send, (shape[0] // n,) + shape[1:])
            elif int(np.prod(shape)) % n == 0:
                out = _empty(send, (int(np.prod(shape)) // n,))
            else:
                raise ValueError(f"send has {int(np.prod(shape))} elements, not a multiple of "
                                 f"the world size {n}")
        return self._c.reduce_scatter_async(send, _arr(out, "out"), op, dtype)

    def reduce_scatter(self, send: Any, out: Any = None, op: str = "sum", *,
                       dtype: Optional[str] = None) -> Any:
        """The element-wise ``op`` ("sum" or "max") over ranks of ``send`` (size*n
        elements), of which rank r receives block r (elements [r*n, (r+1)*n)) in ``out``
        (n elements); returns ``out``. None allocates it (send split along dim 0). fp16/bf16
        sums add in fp32 and round to nearest-even per step; integer sums wrap; bool sum is
        OR.

        :raises ValueError: sizes/dtypes that do not match, an unknown op."""
        return self.reduce_scatter_async(send, out, op, dtype=dtype).result()

    def all_reduce_async(self, tensor: Any, op: str = "sum", *, out: Any = None,
                         dtype: Optional[str] = None):
        """As :meth:`all_reduce`; returns a strata.Future whose result is the output."""
        return self._c.all_reduce_async(_arr(tensor, "tensor"), op,
                                        None if out is None else _arr(out, "out"), dtype)

    def all_reduce(self, tensor: Any, op: str = "sum", *, out: Any = None,
                   dtype: Optional[str] = None) -> Any:
        """Element-wise ``op`` ("sum" or "max") over ranks of ``tensor``, written in place
        (or into ``out``, same dtype and number of elements); returns the output.

        :raises ValueError: sizes/dtypes that do not match, an unknown op."""
        return self.all_reduce_async(tensor, op, out=out, dtype=dtype).result()

    def broadcast_async(self, tensor: Any, root: int = 0, *, dtype: Optional[str] = None):
        """As :meth:`broadcast`; returns a strata.Future whose result is ``tensor``."""
        return self._c.broadcast_async(_arr(tensor, "tensor"), root, dtype)

    def broadcast(self, tensor: Any, root: int = 0, *, dtype: Optional[str] = None) -> Any:
        """Copies rank ``root``'s ``tensor`` into ``tensor`` on every rank (same size
        everywhere); returns it.  :raises ValueError: root not in [0, size)."""
        return self.broadcast_async(tensor, root, dtype=dtype).result()

    def barrier_async(self):
        """As :meth:`barrier`; returns a strata.Future."""
        return self._c.barrier_async()

    def barrier(self) -> None:
        """Returns on every rank once every rank has called it."""
        self._c.barrier()

    # ---- partitioned objects (host memory, Gloo) ----------------------------------------
    def put_partitioned_async(self, store: Any, key: str, full: Any, *, tier: str = "nvme",
                              overwrite: bool = False, piece_bytes: Any = None,
                              dtype: Optional[str] = None):
        """As :meth:`put_partitioned`; returns a strata.Future (result None)."""
        return self._c.put_partitioned_async(_store_impl(store), key, _arr(full, "full"), tier,
                                             overwrite, piece_bytes, dtype)

    def put_partitioned(self, store: Any, key: str, full: Any, *, tier: str = "nvme",
                        overwrite: bool = False, piece_bytes: Any = None,
                        dtype: Optional[str] = None) -> None:
        """Collective: every rank passes the whole tensor ``full`` and stores only the slice
        it owns (``owned_range(full.numel())``) in its own ``store`` as ``key#part`` plus the
        record ``key#partmeta``. ``tier``: "nvme", "host" or "device"; ``overwrite``
        replaces an existing key.

        :raises AlreadyExistsError: (KeyError) ``key`` exists and not ``overwrite``.
        :raises UnavailableError: another rank failed (naming it) or died."""
        self.put_partitioned_async(store, key, full, tier=tier, overwrite=overwrite,
                                   piece_bytes=piece_bytes, dtype=dtype).result()

    def put_partitioned_slice_async(self, store: Any, key: str, owned_slice: Any,
                                    full_shape: Sequence[int], dtype: Optional[str] = None, *,
                                    tier: str = "nvme", overwrite: bool = False,
                                    piece_bytes: Any = None):
        """As :meth:`put_partitioned_slice`; returns a strata.Future (result None)."""
        return self._c.put_partitioned_slice_async(
            _store_impl(store), key, _arr(owned_slice, "owned_slice"), tuple(full_shape), dtype,
            tier, overwrite, piece_bytes)

    def put_partitioned_slice(self, store: Any, key: str, owned_slice: Any,
                              full_shape: Sequence[int], dtype: Optional[str] = None, *,
                              tier: str = "nvme", overwrite: bool = False,
                              piece_bytes: Any = None) -> None:
        """As :meth:`put_partitioned`, but each rank passes only its slice: ``owned_slice``
        holds ``end - begin`` elements (``owned_range(prod(full_shape))``, any shape; may be
        empty) of the full tensor of shape ``full_shape``. ``dtype``: the full tensor's
        dtype, default owned_slice's (it must agree, except "bf16" for numpy uint16).

        :raises ValueError: owned_slice's size is not this rank's share (both named)."""
        self.put_partitioned_slice_async(store, key, owned_slice, full_shape, dtype, tier=tier,
                                         overwrite=overwrite, piece_bytes=piece_bytes).result()

    def fetch_partitioned_async(self, store: Any, key: str, out: Any, *,
                                piece_bytes: Any = None, pipelined: bool = True,
                                dtype: Optional[str] = None):
        """As :meth:`fetch_partitioned`, returning at once a strata.Future whose result is
        ``out`` (for prefetch); don't touch ``out`` until it is done."""
        return self._c.fetch_partitioned_async(_store_impl(store), key, _arr(out, "out"),
                                               piece_bytes, pipelined, dtype)

    def fetch_partitioned(self, store: Any, key: str, out: Any, *, piece_bytes: Any = None,
                          pipelined: bool = True, dtype: Optional[str] = None) -> Any:
        """Collective: every rank reads its slice of ``key`` from its own ``store`` (in
        pieces of ``piece_bytes``, default 8 MiB, overlapped with the all-gather when
        ``pipelined``) and the slices are all-gathered into ``out`` — a preallocated
        tensor of the full object's dtype and shape (C-contiguous, CPU) — on every rank;
        returns ``out``, bit-exact to what was put.

        :raises FailedPreconditionError: put over another world size (both named).
        :raises InvalidArgumentError: (ValueError) ``out``'s dtype/shape differ from the
            recorded ones (both named).
        :raises NotFoundError: (KeyError) a rank lacks ``key`` ("rank R: ...").
        :raises UnavailableError: a rank's read failed or a peer died (naming the rank)."""
        return self.fetch_partitioned_async(store, key, out, piece_bytes=piece_bytes,
                                            pipelined=pipelined, dtype=dtype).result()

    def reduce_scatter_grads_async(self, full_grad: Any, out: Any = None, op: str = "sum", *,
                                   piece_bytes: Any = None, dtype: Optional[str] = None):
        """As :meth:`reduce_scatter_grads`; returns a strata.Future whose result is
        ``out``."""
        full_grad = _arr(full_grad, "full_grad")
        if out is None:
            begin, end = self.owned_range(int(np.prod(tuple(full_grad.shape))))
            out = _empty(full_grad, (end - begin,))
        return self._c.reduce_scatter_grads_async(full_grad, _arr(out, "out"), op, piece_bytes,
                                                  dtype)

    def reduce_scatter_grads(self, full_grad: Any, out: Any = None, op: str = "sum", *,
                             piece_bytes: Any = None, dtype: Optional[str] = None) -> Any:
        """Collective, gradient side of ZeRO-3: ``full_grad`` (numel elements, the same
        numel on every rank, any shape) is reduced element-wise with ``op`` over ranks and
        rank r receives its owned elements ``owned_range(numel)`` in ``out`` (end - begin
        elements, any shape; None allocates a 1-d one); returns ``out``. numel needs not be
        a multiple of the world size (padding is internal). Must not overlap full_grad.

        :raises ValueError: out's size is not this rank's share, dtypes differ, bad op."""
        return self.reduce_scatter_grads_async(full_grad, out, op, piece_bytes=piece_bytes,
                                               dtype=dtype).result()
