"""The generated protobuf/gRPC modules, regenerated first if proto/ changed."""

from engram_core import protogen

protogen.ensure()

from engram_core._gen.engram.v1 import (  # noqa: E402
    admin_pb2,
    admin_pb2_grpc,
    context_pb2,
    host_pb2,
    host_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
)

__all__ = [
    "admin_pb2",
    "admin_pb2_grpc",
    "context_pb2",
    "host_pb2",
    "host_pb2_grpc",
    "memory_pb2",
    "memory_pb2_grpc",
]
