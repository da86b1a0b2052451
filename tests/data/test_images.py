"""Images decoded the same way everywhere and judged before they are kept: every hostile input a drop with its reason,
never a traceback or a hang; the perceptual hash close for copies of a real photo, far for other images."""

from __future__ import annotations

import base64
import io
import json
import re
import sysconfig
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageEnhance

from mindfoundry.data.images.decode import ImageLimits, ImageRejected, decode, square
from mindfoundry.data.images.hashes import fingerprint, hamming, pixel_key
from mindfoundry.data.images.likeness import likeness

SITE = Path(sysconfig.get_paths()["purelib"])
#: Real photos that ship inside installed packages (nothing downloaded).
PHOTOS = [SITE / "matplotlib/mpl-data/sample_data/grace_hopper.jpg", SITE / "sklearn/datasets/images/flower.jpg",
          SITE / "sklearn/datasets/images/china.jpg"]
LIMITS = ImageLimits(min_side=16, max_aspect=4.0, max_pixels=4_000_000)


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def rejected(data: bytes, limits: ImageLimits = LIMITS) -> tuple[str, str]:
    with pytest.raises(ImageRejected) as caught:
        decode(data, limits)
    return caught.value.reason, caught.value.detail


def test_hostile_files_are_drops_with_their_reason() -> None:
    photo = PHOTOS[0].read_bytes()
    assert rejected(b"") == ("empty", "0 bytes")
    assert rejected(b"<html>not an image</html>")[0] == "undecodable"
    assert rejected(photo[: len(photo) // 3])[0] == "truncated"  # a JPEG cut in its scan data
    png = encoded(Image.new("RGB", (400, 300), (10, 20, 30)), "PNG")
    assert rejected(png[:100])[0] == "truncated"
    # a decompression bomb: a 20000 x 20000 PNG of one colour is 0.4 GB decoded and ~100 KB on disk
    bomb = encoded(Image.new("1", (20_000, 20_000)), "PNG")
    reason, detail = rejected(bomb)
    assert reason == "too_many_pixels" and "refused before decoding" in detail and len(bomb) < 200_000
    assert rejected(encoded(Image.new("1", (3000, 3000)), "PNG")) == (
        "too_many_pixels", "3000x3000 = 9,000,000 pixels > max_pixels 4,000,000 (refused before decoding)")
    assert rejected(encoded(Image.new("RGB", (12, 40)), "PNG")) == ("too_small", "12x40: the shorter side is under "
                                                                     "min_side 16")
    assert rejected(encoded(Image.new("RGB", (400, 50)), "PNG")) == ("aspect", "400x50: 8.00:1 exceeds max_aspect 4")


def test_every_mode_becomes_the_same_rgb() -> None:
    """A JPEG named .png decodes as the JPEG it is; CMYK, 16-bit, palette, alpha and animated images become RGB
    uint8 by one rule each."""
    photo = decode(PHOTOS[0].read_bytes(), LIMITS)
    assert photo.format == "JPEG" and photo.pixels.dtype == np.uint8 and photo.pixels.shape == (600, 512, 3)
    cmyk = decode(encoded(Image.new("CMYK", (20, 20), (0, 255, 0, 0)), "JPEG", quality=100), LIMITS)
    assert cmyk.pixels.shape == (20, 20, 3) and abs(int(cmyk.pixels[10, 10, 1]) - 0) <= 2  # magenta: no green
    wide = np.full((20, 20), 40_000, np.uint16)  # a 16-bit greyscale PNG keeps its top 8 bits
    assert set(np.unique(decode(encoded(Image.fromarray(wide), "PNG"), LIMITS).pixels)) == {40_000 // 256}
    rgba = Image.new("RGBA", (20, 20), (255, 0, 0, 0))  # fully transparent red: white on the page
    assert (decode(encoded(rgba, "PNG"), LIMITS).pixels == 255).all()
    palette = Image.new("P", (20, 20), 1)
    palette.putpalette([0, 0, 0, 0, 0, 255] + [0] * 762)
    palette.info["transparency"] = 0
    assert (decode(encoded(palette, "PNG"), LIMITS).pixels[0, 0] == [0, 0, 255]).all()
    frames = [Image.new("RGB", (20, 20), color) for color in ((255, 0, 0), (0, 255, 0))]
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:])
    animated = decode(gif.getvalue(), LIMITS)
    assert animated.frames == 2 and tuple(animated.pixels[5, 5]) == (255, 0, 0)  # the first frame
    sideways = Image.new("RGB", (40, 20), (0, 0, 0))
    exif = sideways.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to view"
    assert decode(encoded(sideways, "JPEG", exif=exif), LIMITS).pixels.shape == (40, 20, 3)  # upright


def test_square_is_pil_bicubic_of_the_shorter_side_then_the_centre() -> None:
    pixels = decode(PHOTOS[2].read_bytes(), LIMITS).pixels  # 427 x 640
    out = square(pixels, 32)
    expected = Image.fromarray(pixels).resize((48, 32), Image.Resampling.BICUBIC).crop((8, 0, 40, 32))
    assert out.shape == (32, 32, 3) and np.array_equal(out, np.asarray(expected))


def _disc(colour: tuple[int, int, int]) -> np.ndarray:
    image = Image.new("RGB", (96, 96), "white")
    ImageDraw.Draw(image).ellipse((16, 20, 80, 76), fill=colour)
    return np.asarray(image)


def test_copies_are_dropped_at_the_default_settings_and_look_alikes_are_not() -> None:
    """The copies of three real photos -- halved, JPEG-30, 5% cut off every side, 20% brighter, 40% less saturated
    -- are dropped as near copies of their photo at the default near_distance and near_likeness; the photo with its
    channels swapped (another colour) and the other photos are kept; a red disc's paler copy is dropped, the same
    disc in blue or green (the same hash) is kept."""
    from mindfoundry.config.image_config import ImagesConfig
    from mindfoundry.data.images.clusters import copies_of, first_copies, near_candidates

    images = []
    for path in PHOTOS:
        pixels = decode(path.read_bytes(), LIMITS).pixels
        image = Image.fromarray(pixels)
        h, w = pixels.shape[:2]
        images += [pixels, np.asarray(image.resize((w // 2, h // 2))),
                   decode(encoded(image, "JPEG", quality=30), LIMITS).pixels,
                   pixels[h // 20:h - h // 20, w // 20:w - w // 20],
                   np.asarray(ImageEnhance.Brightness(image).enhance(1.2)),
                   np.asarray(ImageEnhance.Color(image).enhance(0.6)), pixels[:, :, [2, 0, 1]]]
    images += [_disc((220, 30, 30)), _disc((220, 90, 90)), _disc((30, 30, 220)), _disc((30, 160, 30))]
    found = [fingerprint(p) for p in images]
    assert len({f.hashes[0] for f in found[-4:]}) == 1  # the discs: one hash, so the looks decide
    settings = ImagesConfig()
    looks, hashes = np.stack([f.look for f in found]), np.array([f.hashes for f in found], np.uint64)
    copies = copies_of(first_copies(np.array([pixel_key(p) for p in images], np.uint64)),
                       near_candidates(hashes, looks.__getitem__, settings.near_distance), settings.near_likeness)
    photo_copies = {7 * photo + k: 7 * photo for photo in range(3) for k in range(1, 6)}
    expected = np.arange(len(images))
    expected[list(photo_copies)] = list(photo_copies.values())
    expected[22] = 21  # the paler disc
    assert copies.kept_by.tolist() == expected.tolist()
    # measured: copies 0.975 (grace_hopper, cut) to 1.0 alike; swapped channels 0.022-0.156; a paler disc 1.0,
    # blue and green discs 0.011
    dropped = copies.likeness[list(photo_copies)]
    assert dropped.min() >= settings.near_likeness and copies.likeness[22] > 0.99
    others = likeness(looks[[0, 0, 7, 21, 21]], looks[[6, 7, 14, 23, 24]])
    assert others.max() < 0.2, others


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _samples(files: list[Path], root: Path, **source) -> list:
    from mindfoundry.config.data_config import SourceConfig
    from mindfoundry.data.images.sources import image_samples
    from mindfoundry.data.ingest.files import SourceStats
    from mindfoundry.storage.resolve import locate

    src = SourceConfig(name="s", paths=[str(root)], **source)
    return list(image_samples([locate(f) for f in files], locate(root), src, SourceStats()))


def test_webdataset_records_and_folders_give_pairs_and_name_what_is_missing(tmp_path) -> None:
    jpeg, png = PHOTOS[0].read_bytes(), encoded(Image.new("RGB", (32, 32), (1, 2, 3)), "PNG")
    shard = _tar(tmp_path / "00000.tar", [
        ("000000000.jpg", jpeg), ("000000000.txt", b"a woman in uniform"), ("000000000.json", b'{"caption": "x"}'),
        ("000000001.png", png), ("000000001.json", b'{"caption": "a dark square"}'),
        ("000000002.txt", b"a caption and no image")])
    got = _samples([shard], tmp_path, modality="image_text", text_field="caption")
    assert [(s.key, s.caption, s.problem and s.problem[0]) for s in got] == [
        ("s:00000.tar:000000000", "a woman in uniform", None), ("s:00000.tar:000000001", "a dark square", None),
        ("s:00000.tar:000000002", None, "no_image")]
    assert got[0].data == jpeg and got[1].data == png and got[1].record == 1
    cut = tmp_path / "cut" / "00001.tar"
    cut.parent.mkdir()
    cut.write_bytes(shard.read_bytes()[: len(jpeg) // 2 + 2048])  # the first member's data cut short
    damaged = _samples([cut], cut.parent, modality="image_text", text_field="caption")
    assert [s.problem[0] for s in damaged] == ["corrupt_tar"]
    # LLaVA-style records: a path relative to the record's file, the caption in the last turn
    (tmp_path / "llava" / "imgs").mkdir(parents=True)
    (tmp_path / "llava" / "imgs" / "a.jpg").write_bytes(jpeg)
    rows = [{"image": "imgs/a.jpg", "conversations": [{"value": "<image>"}, {"value": "a portrait"}]},
            {"image": "../00000.tar", "conversations": [{"value": "x"}, {"value": "escapes"}]},
            {"image": "imgs/none.jpg", "conversations": [{"value": "x"}, {"value": "missing"}]}]
    (tmp_path / "llava" / "chat.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = _samples([tmp_path / "llava" / "chat.jsonl"], tmp_path / "llava", modality="image_text",
                   text_field="conversations.-1.value")
    assert [(s.caption, s.problem and s.problem[0]) for s in got] == [
        ("a portrait", None), (None, "outside_source"), (None, "missing_image")]
    assert got[0].data == jpeg and got[0].key == "s:chat.jsonl:1"
    # a folder of images with sidecar captions
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.png").write_bytes(png)
    (tmp_path / "folder" / "a.txt").write_text("a dark square\n")
    (tmp_path / "folder" / "b.jpg").write_bytes(jpeg)
    files = [tmp_path / "folder" / "a.png", tmp_path / "folder" / "b.jpg"]
    (tmp_path / "named").mkdir()
    (tmp_path / "named" / "photo.png").write_bytes(jpeg)  # a JPEG named .png: read as what its bytes are
    named = _samples([tmp_path / "named" / "photo.png"], tmp_path / "named", modality="image")
    assert named[0].problem is None and decode(named[0].data, LIMITS).format == "JPEG"
    got = _samples(files, tmp_path / "folder", modality="image_text")
    assert [(s.key, s.caption, s.problem and s.problem[0]) for s in got] == [
        ("s:a.png", "a dark square", None), ("s:b.jpg", None, "no_caption")]
    assert [s.problem for s in _samples(files, tmp_path / "folder", modality="image")] == [None, None]


def test_near_pairs_are_every_pair_within_the_distance_and_clusters_follow_them() -> None:
    """Against the brute force on 600 random hashes with planted copies (1 to 10 bits flipped), alone and as the
    whole and centre hashes of 300 images."""
    from mindfoundry.data.images.clusters import components, first_copies, hash_pairs, near_pairs

    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**63, 400, dtype=np.uint64)
    flips = [np.uint64(sum(1 << int(b) for b in rng.choice(64, k, replace=False))) for k in rng.integers(1, 11, 200)]
    hashes = np.concatenate([base, base[:200] ^ np.array(flips, np.uint64)])
    for distance in (0, 5, 8, 12):
        first, second = near_pairs(hashes, distance)
        i, j = np.triu_indices(len(hashes), 1)
        within = hamming(hashes[i], hashes[j]) <= distance
        assert set(zip(first.tolist(), second.tolist())) == set(zip(i[within].tolist(), j[within].tolist()))
    # with centre hashes: a pair is the whole hash of one near the whole or a centre hash of the other
    centres = np.stack([hashes[:300], hashes[300:], hashes[::-1][:300]], axis=1)
    first, second, bits = hash_pairs(centres, 8)
    assert len(first) >= 100  # the planted copies as centre hashes (measured 260 pairs)
    i, j = np.triu_indices(300, 1)
    apart = np.min([hamming(centres[i, 0], centres[j, 0])] + [hamming(centres[a, k], centres[b, 0])
                                                               for k in (1, 2) for a, b in ((i, j), (j, i))], axis=0)
    assert list(zip(first.tolist(), second.tolist(), bits.tolist())) == list(zip(
        i[apart <= 8].tolist(), j[apart <= 8].tolist(), apart[apart <= 8].tolist()))
    labels = components(5, np.array([3, 1]), np.array([4, 3]))
    assert labels.tolist() == [0, 1, 2, 1, 1]
    assert first_copies(np.array([7, 3, 7, 3, 9], np.uint64)).tolist() == [0, 1, 0, 1, 4]


@pytest.fixture(scope="module")
def image_corpus(tmp_path_factory) -> Path:
    """Real photos and icons shipped in installed packages, as a folder with sidecar captions and a WebDataset tar:
    copies (resized, re-encoded) of some, and hostile files among them."""
    root = tmp_path_factory.mktemp("images")
    icons = sorted((SITE / "matplotlib/mpl-data/images").glob("*.png"))
    folder = root / "folder"
    folder.mkdir()
    for path in icons[:20]:
        (folder / path.name).write_bytes(path.read_bytes())
        (folder / f"{path.stem}.txt").write_text(f"the {path.stem.replace('_', ' ')} icon")
    photo = Image.open(PHOTOS[0])
    members = []
    for i, path in enumerate(PHOTOS):
        members += [(f"{i:09d}.jpg", path.read_bytes()), (f"{i:09d}.txt", f"photo number {i}".encode())]
    members += [("000000003.jpg", encoded(photo.resize((256, 300)), "JPEG", quality=40)),  # a near copy of photo 0
                ("000000003.txt", b"a smaller copy"),
                ("000000004.png", b"not a png at all"), ("000000004.txt", b"broken"),
                ("000000005.txt", b"a caption without its image"),
                ("000000006.png", encoded(Image.fromarray(np.tile(np.arange(64, dtype=np.uint8), (64, 1))), "PNG")),
                ("000000006.txt", "一张从左到右由黑渐白的灰度图片，用来测试语言规则".encode())]  # language drops it
    _tar(root / "00000.tar", members)
    return root


def test_prepare_curates_images_into_shards_webdataset_reads(tiny_run, image_corpus, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the packaged webdataset builder, nothing from the hub
    from mindfoundry.config.load import load_config
    from mindfoundry.data.clean.droplog import read_drops
    from mindfoundry.data.prepare.pipeline import prepare_data

    cfg = load_config(tiny_run("images", data__sources=[
        {"name": "icons", "paths": [str(image_corpus / "folder")], "modality": "image_text"},
        {"name": "photos", "paths": [str(image_corpus / "00000.tar")], "modality": "image_text"}],
        data__images={"size": 32, "min_side": 16}, data__validation_fraction=0.3,
        data__clean={"language": {"keep": ["en"]}}))
    logs: list[str] = []
    data = prepare_data(cfg, log=logs.append)
    images = data.manifest["images"]
    by_name = {s["name"]: s for s in images["sources"]}
    assert by_name["photos"]["read"] == 7
    assert by_name["photos"]["dropped"] == {"caption_language": 1, "no_image": 1, "undecodable": 1}
    assert images["dedup"]["near"] >= 1  # the smaller JPEG of photo 0
    drops = [line for line in read_drops(data.root / "drops.jsonl.gz") if line["block"] == "image"]
    assert {(d["source"], d["reason"]) for d in drops} >= {("photos", "no_image"), ("photos", "undecodable"),
                                                           ("photos", "near")}
    language = [line for line in read_drops(data.root / "drops.jsonl.gz") if line["block"] == "language"]
    assert len(language) == 1 and language[0]["path"] == "00000.tar" and language[0]["record"] == 6
    total = sum(images["splits"][split]["images"] for split in ("train", "validation"))
    assert total == sum(s["kept"] for s in images["sources"])
    pixels = np.load(data.root / "images" / "train" / "icons.pixels.npy")
    assert pixels.dtype == np.uint8 and pixels.shape[1:] == (32, 32, 3)
    assert logs and any(line.startswith("images: read ") for line in logs)
    # the real readers: webdataset and Hugging Face datasets read the tars; the pixels are what prepare decoded
    import webdataset as wds

    tars = sorted(str(p) for p in (data.root / "images" / "train" / "icons").glob("*.tar"))
    samples = list(wds.WebDataset(tars, shardshuffle=False, empty_check=False).decode("rgb8"))
    assert len(samples) == len(pixels)
    for sample, row in zip(samples, pixels, strict=True):
        image = sample.get("png", sample.get("jpg"))
        assert np.array_equal(square(image, 32), row)
        assert sample["txt"].startswith("the ") and sample["json"]["source"] == "icons"
    from datasets import load_dataset

    hf = load_dataset("webdataset", data_files={"train": tars}, split="train")
    assert len(hf) == len(pixels) and hf[0]["txt"] == samples[0]["txt"]
    assert np.array_equal(square(np.asarray(hf[0]["png"].convert("RGB")), 32), pixels[0])
    # what the trainers read: every source's pixel shard as one set, in a seeded order per epoch, captions beside
    from mindfoundry.data.dataset.image_samples import open_image_samples
    from mindfoundry.data.dataset.loader import OrderedSamples
    from mindfoundry.data.dataset.packing import SampleOrder
    from mindfoundry.data.dataset.prepared import DataError
    from mindfoundry.data.tokenizer import read_tokenizer

    train = open_image_samples(data.root, data.manifest, "train")
    assert train.sources == ["icons", "photos"] and len(train) == images["splits"]["train"]["images"]
    photos = np.load(data.root / "images" / "train" / "photos.pixels.npy")
    assert np.array_equal(train.get_pixels(np.arange(len(train))), np.concatenate([pixels, photos]))
    tokenizer, _ = read_tokenizer(data.root / "tokenizer.json")
    assert tokenizer.decode(train.get_captions(np.array([0]))[0].tolist()) == samples[0]["txt"]
    batches = OrderedSamples(train, SampleOrder(len(train), seed=3))
    first, indices = batches.get_batch(0, len(train))
    assert sorted(indices.tolist()) == list(range(len(train))) and indices.tolist() != list(range(len(train)))
    assert np.array_equal(first, train.get_pixels(indices))
    assert np.array_equal(batches.get_batch(5, 3)[0], first[5:8])  # a position's image, however the batch is cut
    np.save(data.root / "images" / "train" / "photos.pixels.npy", photos[:1])  # a shard that lost rows
    with pytest.raises(DataError, match=r"photos.pixels.npy' is uint8 \(1, 32, 32, 3\), the manifest says"):
        open_image_samples(data.root, data.manifest, "train")


def test_text_and_image_sources_prepare_together(tiny_run, corpus_dir, image_corpus, capsys) -> None:
    """Text sources keep their shards and mixture; the image source's captions join the tokenizer's training text;
    `data validate` and `data inspect` read the folder."""
    from mindfoundry.cli.main import main
    from mindfoundry.config.load import load_config
    from mindfoundry.data.prepare.pipeline import prepare_data

    config = tiny_run("mixed", data__sources=[
        {"name": "code", "paths": [str(corpus_dir / "code.jsonl")]},
        {"name": "icons", "paths": [str(image_corpus / "folder")], "modality": "image_text", "category": "pictures"}],
        data__mixture={"weights": {"code": 1}}, data__images={"size": 16})
    data = prepare_data(load_config(config), log=lambda _: None)
    assert [s["name"] for s in data.manifest["sources"]] == ["code"]
    assert [s["name"] for s in data.manifest["images"]["sources"]] == ["icons"]
    assert [info["path"] for info in data.manifest["splits"]["train"]["shards"]] == ["train/code"]
    text_only = prepare_data(load_config(tiny_run("text-only", data__sources=[
        {"name": "code", "paths": [str(corpus_dir / "code.jsonl")]}])), log=lambda _: None)
    assert data.manifest["tokenizer"]["sha256"] != text_only.manifest["tokenizer"]["sha256"]  # the captions counted
    assert data.manifest["splits"]["train"]["documents"] == text_only.manifest["splits"]["train"]["documents"]
    assert main(["data", "validate", str(config)]) == 0
    assert "icons" in capsys.readouterr().out  # validate's table has a row per image source and split
    assert main(["data", "inspect", str(config)]) == 0
    shown = capsys.readouterr().out
    kept = data.manifest["images"]["sources"][0]["kept"]
    assert "images (16 px pixel shards)" in shown and any(
        line.split()[:4] == ["icons", "image_text", "20", str(kept)] for line in shown.splitlines()), shown
    # the run's HTML report: the image table and a contact sheet of what the trainers read, captions beside
    from mindfoundry.report.render import write_report

    run = data.root.parent
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0, "lr": 1e-3, "tokens": 64}) + "\n")
    html = write_report(run).read_text(encoding="utf-8")
    tiles = re.findall(r'<figure class="tile"><img alt="([^"]*)" src="data:image/png;base64,([^"]+)">', html)
    pixels = np.load(data.root / "images" / "train" / "icons.pixels.npy")
    assert len(tiles) == min(24, len(pixels)) + min(24, data.manifest["images"]["splits"]["validation"]["images"])
    first = np.asarray(Image.open(io.BytesIO(base64.b64decode(tiles[0][1]))))
    assert np.array_equal(first, pixels[0].repeat(4, axis=0).repeat(4, axis=1))  # 16 px drawn at 64, nearest
    import webdataset as wds

    tar = sorted(str(p) for p in (data.root / "images" / "train" / "icons").glob("*.tar"))[0]
    assert tiles[0][0] == next(iter(wds.WebDataset(tar, shardshuffle=False, empty_check=False)))["txt"].decode()

    # MindRecord: MindSpore's own reader returns every image's bytes and caption ids as prepare wrote them
    ms_dataset = pytest.importorskip("mindspore.dataset")
    from mindfoundry.backends.mindspore.mindrecord import export_mindrecord, mindrecord_files
    from mindfoundry.data.dataset.validate import open_shard

    out = export_mindrecord(data.root, data.root.parent / "mr")
    export = json.loads((Path(out) / "export.json").read_text())
    files = [str(Path(out) / name) for name in export["images"]["train"]["files"]]
    rows = list(ms_dataset.MindDataset(files, shuffle=False).create_dict_iterator(output_numpy=True))
    pixels = np.load(data.root / "images" / "train" / "icons.pixels.npy")
    captions = open_shard(data.root / "images" / "train" / "icons.captions")
    assert len(rows) == len(pixels) == len(captions) > 0
    for index, row in enumerate(rows):
        image = np.asarray(Image.open(io.BytesIO(bytes(row["image"]))).convert("RGB"))
        assert np.array_equal(square(image, 16), pixels[index])
        assert np.array_equal(row["caption"], captions[index]) and str(row["source"]) == "icons"
    assert export["images"]["train"]["page_size"] < 1 << 25 and sum(
        (Path(out) / f).stat().st_size for f in export["images"]["train"]["files"]) < 4 << 20
    assert mindrecord_files(out, "train")  # the text rows are exported as before
    # a flipped pixel byte of the shard: `data validate` names the file
    shard = data.root / "images" / "train" / "icons.pixels.npy"
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0x01
    shard.write_bytes(bytes(raw))
    assert main(["data", "validate", str(config)]) == 2
    assert f"error: {shard}: changed since it was prepared (sha256 differs from the manifest)" in (
        capsys.readouterr().err)
    (data.root / "images" / "train" / "icons.pixels.npy").unlink()  # the folder changed since: the report says so
    assert "No contact sheet: the prepared images cannot be read" in write_report(run).read_text(encoding="utf-8")


def test_llava_style_records_prepare_as_pairs(tiny_run, image_corpus, tmp_path) -> None:
    """LLaVA's layout as it ships: an image path relative to the records' file, the caption in the assistant's
    turn; only the config names the fields."""
    from mindfoundry.config.load import load_config
    from mindfoundry.data.prepare.pipeline import prepare_data

    llava = tmp_path / "llava"
    (llava / "images").mkdir(parents=True)
    icons = sorted((image_corpus / "folder").glob("*.png"))
    with open(llava / "blip_laion_cc_sbu.jsonl", "w", encoding="utf-8") as fh:
        for i, icon in enumerate(icons):
            (llava / "images" / icon.name).write_bytes(icon.read_bytes())
            fh.write(json.dumps({"id": f"{i:09d}", "image": f"images/{icon.name}", "conversations": [
                {"from": "human", "value": "<image>\nRender a clear and concise summary of the photo."},
                {"from": "gpt", "value": (icon.with_suffix(".txt")).read_text()}]}) + "\n")
    cfg = load_config(tiny_run("llava", data__sources=[
        {"name": "llava", "paths": [str(llava / "blip_laion_cc_sbu.jsonl")], "modality": "image_text",
         "text_field": "conversations.-1.value"}], data__images={"size": 16}, data__validation_fraction=0.3))
    data = prepare_data(cfg, log=lambda _: None)
    source = data.manifest["images"]["sources"][0]
    assert source["read"] == len(icons) and source["dropped"] == {}
    import webdataset as wds

    tars = sorted(str(p) for split in ("train", "validation") for p in (data.root / "images" / split / "llava").glob(
        "*.tar"))
    captions = {s["json"]["id"]: s["txt"] for s in wds.WebDataset(tars, shardshuffle=False, empty_check=False).decode()}
    assert len(captions) == source["kept"] and all(text.startswith("the ") for text in captions.values())
    assert set(captions) <= {f"llava:blip_laion_cc_sbu.jsonl:{i + 1}" for i in range(len(icons))}


def test_a_shard_img2dataset_wrote_prepares_as_it_is(tiny_run) -> None:
    """tests/fixtures/img2dataset/00000.tar, written by img2dataset 1.47.0 from local files (its README): every
    sample read with its own caption, the icon it holds at two sizes kept once."""
    from mindfoundry.config.load import load_config
    from mindfoundry.data.prepare.pipeline import prepare_data

    shard = Path(__file__).resolve().parents[1] / "fixtures" / "img2dataset" / "00000.tar"
    cfg = load_config(tiny_run("img2dataset", data__sources=[{"name": "laion", "paths": [str(shard)],
                                                              "modality": "image_text"}],
                               data__images={"size": 16, "min_side": 8}, data__validation_fraction=0.3))
    data = prepare_data(cfg, log=lambda _: None)
    source = data.manifest["images"]["sources"][0]
    with tarfile.open(shard) as tar:
        captions = {m.name.split(".")[0]: tar.extractfile(m).read().decode() for m in tar if m.name.endswith(".txt")}
    assert source["read"] == len(captions) == 19 and source["dropped"] == {}
    assert source["dedup_removed"] >= 1 and source["kept"] == 19 - source["dedup_removed"]
    import webdataset as wds

    ours = [s for split in ("train", "validation") for s in wds.WebDataset(
        sorted(str(p) for p in (data.root / "images" / split / "laion").glob("*.tar")), shardshuffle=False,
        empty_check=False).decode()]
    assert len(ours) == source["kept"]
    assert all(s["txt"] == captions[s["json"]["id"].rsplit(":", 1)[1]] for s in ours)
