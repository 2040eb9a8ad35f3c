from typing import Any, Dict, Iterable, Optional, Tuple, Union

import torch

import strata

class _OffloadAdamBase(torch.optim.Optimizer):
    store: strata.Store
    tier: str
    max_grad_norm: float
    bytes_moved: Dict[str, int]
    last_step: Dict[str, Any]
    def __init__(self, params: Iterable[Any], lr: float = ..., betas: Tuple[float, float] = ...,
                 eps: float = ..., weight_decay: Optional[float] = ..., amsgrad: bool = ..., *,
                 maximize: bool = ..., store: Optional[strata.Store] = ...,
                 path: Optional[str] = ..., tier: str = ...,
                 host_budget: Union[int, str] = ...,
                 pinned_budget: Optional[Union[int, str]] = ...,
                 chunk_size: Union[int, str] = ..., key_prefix: str = ...,
                 max_grad_norm: float = ..., sub_group_numel: int = ..., num_buffers: int = ...,
                 num_threads: int = ..., resume: bool = ..., arithmetic: str = ...,
                 overwrite: bool = ...,
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
