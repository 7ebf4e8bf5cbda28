"""A small Django project that runs django-cluster-jobs' demo jobs on several scheduler nodes."""
