"""imagenet-parquet reader: import without Prefect or DVC (needs pyarrow, pillow, numpy; torch optional)."""
