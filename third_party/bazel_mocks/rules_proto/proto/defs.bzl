"""Offline stand-in for @rules_proto: forwards to Bazel 4.2's native rules."""

load("//proto/private:native.bzl", "NativeProtoInfo")

ProtoInfo = NativeProtoInfo

def proto_lang_toolchain(**kwargs):
    native.proto_lang_toolchain(**kwargs)

def proto_library(**kwargs):
    native.proto_library(**kwargs)
