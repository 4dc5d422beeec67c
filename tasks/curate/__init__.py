"""Curate stage: curation lines -> the overlay beside the shards (merge-on-read)."""
