"""Contract fuzzing of the API with Schemathesis: `python -m tests.contract.run_schemathesis`."""
