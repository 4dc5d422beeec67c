"""Deploy: the Prefect UI's run form and running DVC on behalf of a flow run (no pipeline stage of its own)."""
