"""What operators watch: the probe server, Prometheus metrics and traces of a node."""
