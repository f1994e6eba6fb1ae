"""``KVResponseStatus`` / ``KVResponse`` as FlexKV 34ab141 defines them (flexkv/common/request.py:25-37)."""

from dataclasses import dataclass
from enum import Enum


class KVResponseStatus(Enum):
    SUCCESS = "success"
    NOTFOUND = "not_found"
    UNREADY = "unready"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass
class KVResponse:
    status: KVResponseStatus
    task_id: int
    return_mask: object
