"""Validate stage: schema, label and byte checks over the shards, and the reports a reviewer reads."""
