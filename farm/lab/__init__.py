"""Past one host: the lab's job queue on the results' PostgreSQL, its workers and the device leases.

    jobs.py     the queue's vocabulary: task names, timings, queues and locks by name, ``Job`` (no database)
    reach.py    a queue call run again through an outage (``patient``), the URL as farm shows it
    monitor.py  what the queue says of a sweep, its hosts and workers (``QueueReads``)
    queue.py    ``LabQueue``: defer, settle, cancel, serve (the one module that imports procrastinate)
    follow.py   a queued sweep from the side that queues it: enqueue, follow, a host given up
    worker.py   ``LabWorker``: a lab host's ``farm worker``, its cells, curves and builds
    leases.py   a device's lease while a job measures it (``LeaseKeeper``)
"""
