"""``FlexKVStats`` as FlexKV 34ab141 keeps it (flexkv/integration/stats.py): counters, no logging."""

from dataclasses import dataclass


@dataclass
class FlexKVStats:
    num_log_interval_requests: int
    num_get_requests: int = 0
    num_get_query_tokens: int = 0
    num_gpu_matched_tokens: int = 0
    num_flexkv_matched_tokens: int = 0
    num_put_requests: int = 0
    num_put_query_tokens: int = 0
    num_put_unmatched_tokens: int = 0
    num_failed_requests: int = 0

    @property
    def get_gpu_match_ratio(self) -> float:
        return self.num_gpu_matched_tokens / self.num_get_query_tokens if self.num_get_query_tokens else 0.0

    @property
    def get_flexkv_match_ratio(self) -> float:
        return self.num_flexkv_matched_tokens / self.num_get_query_tokens if self.num_get_query_tokens else 0.0

    def record_get(self, num_prompt_tokens, num_gpu_matched_tokens, num_flexkv_matched_tokens):
        self.num_get_requests += 1
        self.num_get_query_tokens += num_prompt_tokens
        self.num_gpu_matched_tokens += num_gpu_matched_tokens
        self.num_flexkv_matched_tokens += num_flexkv_matched_tokens

    def record_put(self, num_all_tokens, num_unmatched_tokens):
        self.num_put_requests += 1
        self.num_put_query_tokens += num_all_tokens
        self.num_put_unmatched_tokens += num_unmatched_tokens

    def record_faild(self, num_failed_requests):
        self.num_failed_requests += num_failed_requests
