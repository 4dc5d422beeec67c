"""The test suite. A package, so that tests and benchmarks import the shared helpers one way:
`from tests.helpers.<module> import ...` (see tests/helpers/__init__.py)."""
