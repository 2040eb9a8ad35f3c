from typing import Any, Dict, Iterable, Optional, Tuple, Union

import torch

import strata

class _OffloadAdamBase(torch.optim.Optimizer):
    store: strata.Store
    tier: str
    max_grad_norm: float
    bytes_moved: Dict[str, int]
    last_step: Dict[str, Any]
    settings: Dict[str, Any]
    def __init__(self, params: Iterable[Any], lr: float = ..., betas: Tuple[float, float] = ...,
                 eps: float = ..., weight_decay: Optional[float] = ..., amsgrad: bool = ..., *,
                 maximize: bool = ..., store: Optional[strata.Store] = ...,
                 path: Optional[str] = ..., tier: Optional[str] = ...,
                 host_budget: Optional[Union[int, str]] = ...,
                 pinned_budget: Optional[Union[int, str]] = ...,
                 chunk_size: Optional[Union[int, str]] = ..., key_prefix: str = ...,
                 max_grad_norm: float = ..., sub_group_numel: Optional[int] = ...,
                 num_buffers: Optional[int] = ..., num_threads: Optional[int] = ...,
                 resume: bool = ..., arithmetic: Optional[str] = ...,
                 overwrite: bool = ..., overlap_backward: Optional[bool] = ...,
                 overlap_bucket_numel: Optional[int] = ..., config: Optional[str] = ...,
                 foreach: Optional[bool] = ..., capturable: bool = ...,
                 differentiable: bool = ..., fused: bool = ...) -> None: ...
    def add_param_group(self, param_group: Dict[str, Any]) -> None: ...
    def mark_params_changed(self, params: Optional[Iterable[torch.Tensor]] = ...) -> None: ...
    def step(self, closure: Any = ...) -> Any: ...
    def checkpoint(self) -> None: ...
    def state_dict(self) -> Dict[str, Any]: ...
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None: ...
    def close(self) -> None: ...

class OffloadAdam(_OffloadAdamBase): ...
class OffloadAdamW(_OffloadAdamBase): ...
