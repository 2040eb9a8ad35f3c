"""strata.load_config: the configuration file as every strata entry point checks it."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from . import _strata


def load_config(path: Optional[str] = None) -> Dict[str, Any]:
    """The configuration file ``path`` (default ``$STRATA_CONFIG``; ``{}`` when neither is
    set), checked as every strata entry point checks it, as a dict: only the keys it sets,
    sizes as int bytes (docs/configuration.md).

    :raises InvalidArgumentError: malformed JSON, an unknown key or a bad value (the message
        names the key path, the value and the file).
    :raises NotFoundError: (or another OSError subclass) the file cannot be read.
    """
    path = path or os.environ.get("STRATA_CONFIG", "")
    return json.loads(_strata.load_config(path)) if path else {}
