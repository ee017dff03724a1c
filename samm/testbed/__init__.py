"""The emulated cloud testbed (issue 5): moto's ASGs, a reconciler turning instances into
worker processes, a durable SQLite job queue, a time-compressed workload driver and billing
in the simulator's units."""
