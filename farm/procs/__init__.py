"""The processes farm starts: on record (registry.py) and supervised (supervise.py): each in its own process
group with a log, stopped only when it still runs what farm started, and stopped when the command that started it
ends. rpc/launch.py starts TVM's tracker and servers with them; the device kinds start their servers with them."""
