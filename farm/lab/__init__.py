"""Past one host: the job queue on the results' PostgreSQL (queue.py), the lab's worker and a queued sweep
followed (worker.py), the device leases (leases.py)."""
