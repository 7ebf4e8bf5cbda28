"""Benchmarks of django-cluster-jobs: scripts that print figures (see README.md)."""
