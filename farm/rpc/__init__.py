"""The only package that speaks TVM's RPC: tracker protocol, sessions, probes, the tracker's and servers' launch (launch.py)."""
