"""Prefect flows: ordering only. Each module is a stage entry point (`python -m flows.<stage>`)."""
