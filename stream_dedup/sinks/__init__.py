"""Where replay's decisions go: files (files.py). Kafka's sink is in kafka/edges.py."""
