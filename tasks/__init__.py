"""The pipeline's work: plain typed functions, no Prefect import here (flows/ wraps them as Prefect tasks)."""
