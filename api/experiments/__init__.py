"""Experiments: their request and answer models, and creating and reading back their child jobs."""
