"""Everything Kafka: the `serve` service, its clients, edges, messages, transactions, changelog."""
