import io
import json
import tarfile

import pytest

from kubetrain.testbed.images import TRAINER_IMAGE, host_mounts, oci_archive

pytestmark = pytest.mark.unit


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        files = {}
        for member in tar.getmembers():
            data = tar.extractfile(member)
            if data is not None:
                files[member.name] = data.read()
        return files


def test_an_archive_is_one_oci_image_with_one_normalised_name():
    archive = oci_archive(TRAINER_IMAGE, b"layer", {"Entrypoint": ["/pause"]})
    files = _members(archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (manifest,) = json.loads(files["index.json"])["manifests"]
    # An extra name (ctr's import-<date>) made the CRI look the image up under it.
    assert manifest["annotations"]["io.containerd.image.name"] == TRAINER_IMAGE
    blob = files["blobs/sha256/" + manifest["digest"].removeprefix("sha256:")]
    assert json.loads(blob)["layers"][0]["size"] == len(b"layer")


def test_archives_are_reproducible_so_the_cache_is_by_content():
    config = {"Entrypoint": ["/pause"]}
    assert oci_archive(TRAINER_IMAGE, b"x", config) == oci_archive(TRAINER_IMAGE, b"x", config)
    assert oci_archive(TRAINER_IMAGE, b"x", config) != oci_archive(TRAINER_IMAGE, b"y", config)


def test_the_python_environment_is_mounted_without_nested_paths():
    mounts = host_mounts()
    assert "/usr" in mounts
    assert not any(a != b and a.startswith(b + "/") for a in mounts for b in mounts)
