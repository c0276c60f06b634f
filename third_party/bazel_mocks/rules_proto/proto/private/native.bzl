"""Offline stand-in for @rules_proto's native shims."""

NativeProtoInfo = ProtoInfo
native_proto_common = proto_common
