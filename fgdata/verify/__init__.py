"""``fgdata verify``: structural and decode checks of WDS shards, an ignore index and readable counts."""

from fgdata.verify.dataset import VerifyReport, report_json, verify_dataset, write_counts, write_ignore
from fgdata.verify.shard import Problem, ShardResult, check_shard

__all__ = ["Problem", "ShardResult", "VerifyReport", "check_shard", "report_json", "verify_dataset", "write_counts", "write_ignore"]
