"""``flexkv.common.debug.flexkv_logger``."""

import logging

flexkv_logger = logging.getLogger("flexkv")
