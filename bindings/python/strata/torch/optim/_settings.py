"""The pipeline settings of strata.torch's optimizers: each from the constructor's argument,
else the configuration file's "optimizer" section, else strata's default (docs/
configuration.md), range-checked with messages naming the argument. OffloadAdam(W) take
every key (:func:`resolve`), OffloadOptimizer those it has arguments for
(:func:`resolve_any`).

Thread-safety: pure functions.
"""

from __future__ import annotations

import operator
import os
from typing import Any, Dict, Optional

import strata


def check_count(name: str, value: Any) -> int:
    """``value`` as an int >= 0, else ValueError naming the argument."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int >= 0, got {type(value).__name__} "
                         f"{value!r}") from None
    if v < 0:
        raise ValueError(f"{name} must be an int >= 0, got {v}")
    return v


def resolve(config: Optional[str], store: Any, given: Dict[str, Any]) -> Dict[str, Any]:
    """The settings in effect: defaults < the configuration file's "optimizer" section <
    the arguments (those not None).

    :param config: the configuration file (None: the one ``store`` was opened with, else
        ``$STRATA_CONFIG``).
    :param store: the strata.Store given to the optimizer, or None.
    :param given: the constructor's tier, host_budget, pinned_budget, sub_group_numel,
        num_buffers, num_threads, arithmetic, overlap_backward, overlap_bucket_numel,
        chunk_size and (optional) state_dtype (None: not given).
    :returns: those keys resolved (``chunk_size`` from the "store" section's chunk_bytes,
        default 4 MiB) plus ``config``.
    :raises ValueError: an unknown tier, or a count that is not an int >= 0.
    :raises strata.InvalidArgumentError: a malformed configuration file.
    """
    if config is None and store is not None:
        config = store.config_file or None
    if config is not None and not isinstance(config, str):
        config = os.fspath(config)  # a pathlib.Path as Store.open takes it (TypeError else)
    conf = strata.load_config(config)
    oconf = conf.get("optimizer", {})

    def pick(key: str, conf_key: str, default: Any) -> Any:
        value = given.get(key)
        return value if value is not None else oconf.get(conf_key, default)

    out = dict(tier=pick("tier", "default_placement", "nvme"),
               host_budget=pick("host_budget", "host_budget_bytes", "1GiB"),
               pinned_budget=pick("pinned_budget", "pinned_budget_bytes", None),
               sub_group_numel=pick("sub_group_numel", "sub_group_numel", 0),
               num_buffers=pick("num_buffers", "num_buffers", 4),
               num_threads=pick("num_threads", "num_threads", 0),
               arithmetic=pick("arithmetic", "arithmetic", "simd"),
               overlap_backward=pick("overlap_backward", "overlap_backward", False),
               overlap_bucket_numel=pick("overlap_bucket_numel", "overlap_bucket_numel", 1),
               state_dtype=pick("state_dtype", "state_dtype", "fp32"),
               config=config)
    chunk_size = given["chunk_size"]
    out["chunk_size"] = (chunk_size if chunk_size is not None
                         else conf.get("store", {}).get("chunk_bytes", "4MiB"))
    return out


def check(settings: Dict[str, Any]) -> Dict[str, Any]:
    """The settings' tier and counts checked (in the constructor's order of checks):
    sub_group_numel, num_buffers, num_threads as ints >= 0.

    :returns: the three counts as ints.
    :raises ValueError: naming the setting.
    """
    if settings["tier"] not in ("nvme", "host", "auto"):
        raise ValueError(f"tier must be 'nvme', 'host' or 'auto', got {settings['tier']!r}")
    return {k: check_count(k, settings[k])
            for k in ("sub_group_numel", "num_buffers", "num_threads")}


#: the settings OffloadOptimizer takes from the file (those it has keyword arguments for);
#: the "optimizer" section's other keys are OffloadAdam(W)'s only
ANY_KEYS = ("tier", "sub_group_numel", "num_buffers", "num_threads", "state_dtype")


def resolve_any(config: Optional[str], store: Any, given: Dict[str, Any]) -> Dict[str, Any]:
    """OffloadOptimizer's settings in effect: each of :data:`ANY_KEYS` from ``given`` (its
    argument, None: not given), else the configuration file's "optimizer" section
    (``default_placement`` for ``tier``), else the default ("nvme", 0, 4, 0, "fp32"), as
    :func:`resolve`; the tier and counts checked as :func:`check` does.

    :param config: the configuration file (None: the one ``store`` was opened with, else
        ``$STRATA_CONFIG``).
    :param store: the strata.Store given to the optimizer, or None.
    :param given: the constructor's arguments named in :data:`ANY_KEYS`.
    :returns: those keys (the counts as ints; ``state_dtype`` as given or as the file
        spells it: "fp32" / "bf16") plus ``config`` (the file read, or None).
    :raises ValueError: an unknown tier, or a count that is not an int >= 0 (naming it).
    :raises strata.InvalidArgumentError: a malformed configuration file (naming the file,
        the key and the value), as for OffloadAdam.
    :raises strata.NotFoundError: the file does not exist.
    """
    args = dict.fromkeys(("host_budget", "pinned_budget", "arithmetic", "overlap_backward",
                          "overlap_bucket_numel", "chunk_size"))
    args.update((k, given.get(k)) for k in ANY_KEYS)
    full = resolve(config, store, args)
    out = {k: full[k] for k in ANY_KEYS}
    out.update(check(full))
    out["config"] = full["config"]
    return out
