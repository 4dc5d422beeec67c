"""What every stage shares: the error type, atomic outputs, the stages' contracts, params, the class catalog,
the shard writer.

Stage packages (`tasks.acquire`, `tasks.extract`, `tasks.convert`, `tasks.curate`, `tasks.validate`, `tasks.views`,
`tasks.deploy`) import only this package and the format modules (`imagenet_parquet.format`, `.overlay`), never each
other."""

from tasks.common.errors import PipelineError
from tasks.common.files import atomic_path, disk_errors, dumps_json, write_json, write_text
from tasks.common.layout import ARCHIVES, DATA_DIR, SPLITS

__all__ = [
    "ARCHIVES",
    "DATA_DIR",
    "SPLITS",
    "PipelineError",
    "atomic_path",
    "disk_errors",
    "dumps_json",
    "write_json",
    "write_text",
]
