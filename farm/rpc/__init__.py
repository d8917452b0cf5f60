"""The only package that speaks TVM's RPC: tracker protocol, sessions, managed processes."""
