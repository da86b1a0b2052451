"""The image demo corpus (`mindfoundry data demo-images`): Noto Color Emoji from its Debian package with the names
the Unicode CLDR package gives them, written in img2dataset's layout and prepared by configs/demo-images.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mindfoundry.errors import InputMissingError

#: The packages are fetched once per machine, outside the test's temporary cache (tests/conftest.py points
#: MF_CACHE_DIR at one), so that CI downloads the 27 MB once.
DEBIAN = Path.home() / ".cache" / "mindfoundry" / "debian"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_demo_corpus_is_the_emoji_with_their_cldr_names_and_prepares(tmp_path, capsys) -> None:
    import webdataset as wds

    from mindfoundry.cli.main import main
    from mindfoundry.data.images.demo_corpus import write_corpus

    out = tmp_path / "corpora" / "demo-images"
    count = write_corpus(DEBIAN, out)
    assert count == 3606  # measured: the font's 3,926 bitmaps less those CLDR 41 does not name
    samples = {s["json"]["codepoints"]: s for s in wds.WebDataset(
        str(out / "emoji" / "00000.tar"), shardshuffle=False, empty_check=False).decode("rgb8")}
    assert len(samples) == count
    grinning, flag = samples["U+1F600"], samples["U+1F1E8 U+1F1E6"]
    assert grinning["txt"] == "grinning face" and grinning["json"]["zh"] == "嘿嘿"
    assert flag["txt"] == "flag: Canada" and flag["json"]["zh"] == "旗: 加拿大"
    assert grinning["png"].shape == (128, 136, 3)
    assert write_corpus(DEBIAN, out) == count  # kept as it is

    config = yaml.safe_load((ROOT / "configs" / "demo-images.yaml").read_text(encoding="utf-8"))
    config["data"]["sources"][0]["paths"] = [str(out / "emoji" / "00000.tar")]
    config["run_dir"] = str(tmp_path / "run")
    path = tmp_path / "demo-images.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    assert main(["prepare", str(path)]) == 0
    manifest = json.loads((tmp_path / "run" / "data" / "manifest.json").read_text(encoding="utf-8"))
    images = manifest["images"]
    # measured: 6 exact copies (one bitmap for two sequences), 1,445 near copies (skin tones, the same sign in two
    # colours); 2,155 kept, 59 held out by cluster
    assert images["sources"][0]["read"] == count and images["dedup"]["exact"] == 6
    assert images["splits"]["train"]["images"] + images["splits"]["validation"]["images"] == images["dedup"]["kept"]
    # the source's own figures add up, exact and near copies both counted (only the near ones were, before)
    assert images["sources"][0]["dedup_removed"] == images["dedup"]["exact"] + images["dedup"]["near"]
    assert images["sources"][0]["kept"] == images["dedup"]["kept"]
    assert main(["data", "validate", str(path)]) == 0


def test_without_apt_get_the_demo_corpus_says_what_it_needs(tmp_path, monkeypatch) -> None:
    from mindfoundry.data.images.demo_corpus import fetch

    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get on it
    with pytest.raises(InputMissingError, match=r"fonts-noto-color-emoji with apt-get .*apt-get update"):
        fetch(tmp_path / "cache")
    assert not (tmp_path / "cache" / "fonts-noto-color-emoji").exists()
