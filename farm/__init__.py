"""farm: device benchmarking and RPC farm orchestrator built on Apache TVM."""

__version__ = "0.1.0"
