"""The engine adapters (hymcache.sglang, hymcache.lmcache) import without
their engines: `import hymcache` and the modules never need sglang or
lmcache, and only the engine classes do. Their tests against the installed
engines run under the engines' venvs: tools/engines/backends_test.sh."""

import importlib.util
import sys

import pytest

import sanitizer_runtime

sanitizer_runtime.reexec_if_needed()  # before hymcache loads the extension

import hymcache  # noqa: E402
import hymcache.lmcache  # noqa: E402
import hymcache.sglang  # noqa: E402

ADAPTERS = [(hymcache.sglang, "HyMCacheStorage", "sglang"),
            (hymcache.lmcache, "HyMCacheConnector", "lmcache")]


@pytest.mark.parametrize("module,name,engine", ADAPTERS)
def test_the_engine_class_needs_only_its_engine(module, name, engine):
    if importlib.util.find_spec(engine) is None:
        with pytest.raises(ImportError, match=engine):
            getattr(module, name)
    else:
        assert getattr(module, name).__name__ == name


@pytest.mark.parametrize("module,name,engine", ADAPTERS)
def test_other_attributes_are_not_found(module, name, engine):
    with pytest.raises(AttributeError):
        module.NoSuchClass  # noqa: B018


class _Key:
    def __init__(self, s):
        self.s = s

    def to_string(self):
        return self.s


def test_lmcache_keys_are_prefixed_and_bounded():
    assert hymcache.lmcache.hymcache_key(_Key("m@1@0@ab@bfloat16")) == \
        b"lmcache/m@1@0@ab@bfloat16"
    long_key = hymcache.lmcache.hymcache_key(_Key("m" * 300))
    assert len(long_key) == 32  # its SHA-256


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"] +
                         sys.argv[1:]))
