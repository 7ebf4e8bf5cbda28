"""The admin as the cluster's console."""
