"""Schemathesis hooks for the API fuzzing (loaded through ``SCHEMATHESIS_HOOKS``): tar
bodies (an image build context, an image archive) are generated as bytes — random ones and
small well-formed tars — since Schemathesis has no serializer for ``application/x-tar``."""

from __future__ import annotations

import io
import tarfile

import schemathesis
from hypothesis import strategies as st


def _tar(files: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


_names = st.sampled_from(["Dockerfile", "index.json", "manifest.json", "oci-layout", "a/b", "../escape"])
_tars = st.dictionaries(_names, st.binary(max_size=256), max_size=4).map(_tar)

schemathesis.openapi.media_type("application/x-tar", st.one_of(st.binary(max_size=2048), _tars))
