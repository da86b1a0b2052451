"""`data.executor: ray` without a shared disk: the work area and the output on object storage (a real S3 server), two
simulated Ray nodes whose local cache folders differ, and output byte-identical to the local executor on local disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_images import image_corpus  # noqa: F401 (the fixture)
from test_parallel_prepare import output_files
from test_prepare_s3 import s3_objects

from mindfoundry.config.load import load_config
from mindfoundry.data.prepare.pipeline import prepare_data

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nodes_without_shared_disk(s3_server, tmp_path_factory):
    """Two Ray nodes of 2 CPUs; each node's processes see their own MF_CACHE_DIR (the node-local disk) and reach the
    S3 server with the standard AWS variables, as the nodes of a cluster with a bucket do."""
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    disks = [tmp_path_factory.mktemp(f"node{n}") for n in range(2)]
    common = {"num_cpus": 2, "object_store_memory": 96 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={
        **common, "include_dashboard": False, "env_vars": {**s3_server.env(), "MF_CACHE_DIR": str(disks[0])}})
    cluster.add_node(**common, env_vars={**s3_server.env(), "MF_CACHE_DIR": str(disks[1])})
    yield cluster.address, disks
    cluster.shutdown()


def test_ray_nodes_sharing_only_a_bucket_write_what_one_local_process_writes(s3, nodes_without_shared_disk,
                                                                              tiny_run) -> None:
    address, disks = nodes_without_shared_disk
    local = load_config(tiny_run("local", data__task_bytes=2**16))
    prepare_data(local, log=lambda _: None)

    bucket = s3.bucket()
    on_ray = load_config(tiny_run(
        "ray", data__executor="ray", data__workers=4, data__ray={"address": address}, data__task_bytes=2**16,
        data__work_dir=f"s3://{bucket}/work", data__output_dir=f"s3://{bucket}/data"))
    data = prepare_data(on_ray, log=lambda _: None)

    ours = output_files(Path(local.data.output_dir))
    theirs = s3_objects(s3, bucket, "data")
    assert theirs.keys() == ours.keys() and all(theirs[name] == blob for name, blob in ours.items())
    stages = data.manifest["timings"]["stages"]
    assert {stage["nodes"] for stage in stages.values() if stage["tasks"] - stage["skipped"] > 1} == {2}
    # each node wrote and fetched under its own disk only; the bucket holds no work area once the output is there
    for disk in disks:
        assert any((disk / "work").rglob("result.json")), f"{disk} was not used"
    assert s3.keys(bucket, "work/") == []


def test_image_sources_in_a_bucket_curated_on_ray_nodes_equal_a_local_prepare(s3, nodes_without_shared_disk, tiny_run,
                                                                               image_corpus) -> None:  # noqa: F811 (the fixture)
    """The image stages (read, dedup across tasks, shards) on two Ray nodes, the images, the work area and the output
    in the bucket: every output object equals what the local executor writes from local files."""
    sources = [("icons", "folder", "folder"), ("photos", "00000.tar", "00000.tar")]

    def config(name: str, root: str, **extra):
        return load_config(tiny_run(name, data__sources=[
            {"name": source, "paths": [f"{root}/{path}"], "modality": "image_text"} for source, path, _ in sources],
            data__images={"size": 16}, data__validation_fraction=0.3, data__task_bytes=2**14, **extra))

    local = prepare_data(config("images-local", str(image_corpus)), log=lambda _: None)
    bucket = s3.bucket()
    s3.upload_tree(image_corpus, bucket, "corpus")
    address, _ = nodes_without_shared_disk
    on_ray = prepare_data(config("images-ray", f"s3://{bucket}/corpus", data__executor="ray", data__workers=4,
                                 data__ray={"address": address}, data__work_dir=f"s3://{bucket}/work",
                                 data__output_dir=f"s3://{bucket}/data"), log=lambda _: None)
    ours = output_files(Path(local.root))
    theirs = s3_objects(s3, bucket, "data")
    assert any(name.endswith(".tar") for name in ours) and any(name.endswith(".pixels.npy") for name in ours)
    assert theirs.keys() == ours.keys() and all(theirs[name] == blob for name, blob in ours.items())
    assert on_ray.manifest["images"]["dedup"] == local.manifest["images"]["dedup"]
    assert on_ray.manifest["timings"]["stages"]["image_read"]["tasks"] > 1  # the folder cut into several tasks
